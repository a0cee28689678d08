"""`trainer=slurm`: two `mulo-train` processes started the way srun starts them (each with its own SLURM
variables) form one DDP run in one run folder named after the job (conf/trainer/slurm.yaml)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import hydra
import pytest
import torch
from mulo_sd.training.config import CONFIG_DIR

from tests.training.test_train_vq import TINY_VQ

MULO_TRAIN = Path(sys.executable).with_name("mulo-train")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_default_run_folder_is_named_after_the_slurm_job(monkeypatch):
    def run_dir() -> str:
        with hydra.initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
            return hydra.compose("train", return_hydra_config=True).hydra.run.dir

    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    assert run_dir() == "runs/train/4242"  # the same in every rank, whenever it starts
    monkeypatch.delenv("SLURM_JOB_ID")
    assert run_dir().startswith("runs/train/20")  # outside SLURM: the start time


@pytest.mark.slow  # two training processes
def test_two_slurm_tasks_train_together_in_the_jobs_run_folder(tmp_path):
    slurm = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": "mulo-test", "SLURM_NTASKS": "2",
             "SLURM_NTASKS_PER_NODE": "2", "SLURM_NNODES": "1", "SLURM_NODEID": "0",
             "SLURM_NODELIST": "localhost", "MASTER_ADDR": "127.0.0.1",
             "MASTER_PORT": str(free_port())}  # fmt: skip
    base = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    overrides = [*TINY_VQ, "trainer=slurm", "trainer.accelerator=cpu", "trainer.devices=2",
                 "trainer.num_nodes=1", "trainer.max_steps=3", "trainer.val_check_interval=3",
                 f"paths.data_dir={tmp_path / 'data'}", f"paths.log_dir={tmp_path / 'logs'}"]  # fmt: skip
    processes, outputs = [], []
    for rank in (0, 1):
        env = {**base, **slurm, "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank), "OMP_NUM_THREADS": "1"}
        outputs.append(open(tmp_path / f"rank{rank}.txt", "w"))
        processes.append(subprocess.Popen([str(MULO_TRAIN), *overrides], cwd=tmp_path, env=env,
                                          stdout=outputs[-1], stderr=subprocess.STDOUT))  # fmt: skip
    codes = [process.wait(timeout=300) for process in processes]
    for output in outputs:
        output.close()
    logs = [(tmp_path / f"rank{rank}.txt").read_text() for rank in (0, 1)]
    assert codes == [0, 0], [log[-3000:] for log in logs]
    assert "Using bfloat16 Automatic Mixed Precision" in logs[0]  # slurm.yaml inherits gpu.yaml's precision
    for rank, log in enumerate(logs):
        assert f"GLOBAL_RANK: {rank}, MEMBER: {rank + 1}/2" in log  # one process group of two
        assert "val/psnr_32" in log  # each rank trained, validated and printed the final metrics
    (run_dir,) = (tmp_path / "logs").glob("*/*")  # both ranks used the one folder named after the job
    assert run_dir.name == "4242"
    checkpoint = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert checkpoint["global_step"] == 3  # written by rank 0 at the end
