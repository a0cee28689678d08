"""SIGTERM and Ctrl-C stop a training run after its current step with a resumable last.ckpt of that step, a
non-zero exit and the command that resumes it; a second Ctrl-C stops it at once (training/preemption.py)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from lightning.pytorch.utilities.exceptions import SIGTERMException
from mulo_sd.training.preemption import CheckpointOnStop, stop_on_signals
from mulo_sd.training.train import run

from tests.helpers import compose_train_config
from tests.training.test_train_vq import TINY_VQ

REPO = Path(__file__).resolve().parents[2]
COMMON = [*TINY_VQ, "trainer.max_steps=6", "trainer.val_check_interval=100",
          "callbacks.checkpoint.every_n_train_steps=3"]  # fmt: skip


class WaitForStop(L.Callback):
    """Before the batch after optimiser step `step`, creates `marker` and waits for a stop signal, so the
    test's SIGTERM lands in a known step however slow or fast the machine is. With `again`, then creates that
    marker and waits on inside the step, for a second signal that stops the run at once."""

    def __init__(self, step: int, marker: str, timeout: float = 120.0, again: str | None = None):
        self.step, self.marker, self.timeout = step, Path(marker), timeout
        self.again = Path(again) if again else None

    def on_train_batch_start(self, trainer: L.Trainer, pl_module, batch, batch_idx: int) -> None:
        if trainer.global_step != self.step:
            return
        self.marker.touch()
        deadline = time.monotonic() + self.timeout
        while not trainer.received_sigterm and time.monotonic() < deadline:
            time.sleep(0.01)
        if self.again is not None:
            self.again.touch()
            while time.monotonic() < deadline:
                time.sleep(0.01)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def weights(ckpt: Path) -> dict[str, torch.Tensor]:
    return torch.load(ckpt, map_location="cpu", weights_only=False)["state_dict"]


class AccumulatingTrainer:
    """What CheckpointOnStop and ends_accumulation read of a Trainer that accumulates `batches` per step."""

    def __init__(self, batches: int):
        self._signal_connector = SimpleNamespace(received_sigterm=False)
        self.accumulate_grad_batches, self.num_training_batches, self.is_last_batch = batches, 1000, False
        self.progress = SimpleNamespace(ready=0)
        self.fit_loop = SimpleNamespace(
            epoch_loop=SimpleNamespace(batch_progress=SimpleNamespace(current=self.progress))
        )

    @property
    def received_sigterm(self) -> bool:
        return self._signal_connector.received_sigterm


def received_stop_after_each_batch(batches: int, signal_at: int, count: int) -> list[bool]:
    """Lightning's stop flag after CheckpointOnStop's on_train_batch_end of micro-batches 1..count, with
    `batches` per accumulation window and SIGTERM during micro-batch `signal_at`."""
    trainer, callback, flags = AccumulatingTrainer(batches), CheckpointOnStop(), []
    for ready in range(1, count + 1):
        trainer.progress.ready = ready
        trainer._signal_connector.received_sigterm |= ready == signal_at
        callback.on_train_batch_end(trainer, None, None, None, ready - 1)
        flags.append(trainer.received_sigterm)  # what Lightning's loop checks next
    return flags


def test_a_stop_inside_an_accumulation_window_waits_for_its_last_micro_batch():
    assert received_stop_after_each_batch(3, signal_at=4, count=6) == [False] * 5 + [True]
    assert received_stop_after_each_batch(3, signal_at=6, count=6) == [False] * 5 + [True]
    assert received_stop_after_each_batch(1, signal_at=4, count=4) == [False] * 3 + [True]


def stop_training(
    tmp_path: Path, signum: int, overrides: list[str], env: dict[str, str], again: bool = False
) -> tuple[int, str]:
    """Run `mulo-train` (6 steps, checkpoints every 3) in a subprocess, send `signum` once it waits after
    step 3 (`again`: a second time once it has taken the first and waits on); its exit code and output."""
    markers = [tmp_path / "waiting", *([tmp_path / "waiting-again"] if again else [])]
    overrides = [*COMMON, f"paths.data_dir={tmp_path / 'data'}", f"paths.log_dir={tmp_path / 'logs'}",
                 f"hydra.run.dir={tmp_path / 'stopped'}", f"+callbacks.wait._target_={__name__}.WaitForStop",
                 "+callbacks.wait.step=3", f"+callbacks.wait.marker={markers[0]}",
                 *([f"+callbacks.wait.again={markers[1]}"] if again else []), *overrides]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", **env}  # the in-process runs use one thread (conftest.py)
    with open(tmp_path / "output.txt", "w") as output:
        process = subprocess.Popen([sys.executable, "-m", "mulo_sd.training.train", *overrides], cwd=REPO,
                                   env=env, stdout=output, stderr=subprocess.STDOUT)  # fmt: skip
        deadline = time.monotonic() + 180  # data generation, imports and 3 steps on a busy machine
        for marker in markers:
            while not marker.exists() and process.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            assert marker.exists(), (tmp_path / "output.txt").read_text()[-3000:]
            process.send_signal(signum)
        code = process.wait(timeout=120)
    return code, (tmp_path / "output.txt").read_text()


def assert_stopped_at_step_4_and_resumes_exactly(tmp_path: Path, signum: int) -> None:
    """A signal during step 4: last.ckpt of step 4, exit 128 + signum, the resume command logged; the resume
    from it ends on the uninterrupted run's weights, bit for bit."""
    code, log = stop_training(tmp_path, signum, [], {})
    assert code == 128 + signum, log[-3000:]
    last = tmp_path / "stopped" / "checkpoints" / "last.ckpt"
    assert (last.parent / "step000003.ckpt").is_file()  # the interval's, one step earlier
    assert torch.load(last, map_location="cpu", weights_only=False)["global_step"] == 4  # the stop step
    assert "stopped by a signal at step 4" in log
    assert "Resume with:\nmulo-train experiment=testbed/vq" in log and log.count(f"ckpt_path={last}") == 1

    run(compose_train_config(tmp_path / "full", COMMON))
    run(compose_train_config(tmp_path / "resumed", [*COMMON, f"ckpt_path={last}"]))
    full = weights(tmp_path / "full" / "run" / "checkpoints" / "last.ckpt")
    resumed = weights(tmp_path / "resumed" / "run" / "checkpoints" / "last.ckpt")
    assert full.keys() == resumed.keys()
    for name in full:
        assert torch.equal(full[name], resumed[name]), name


@pytest.mark.slow  # a training subprocess
def test_sigterm_saves_the_current_step_exits_nonzero_and_resumes_exactly(tmp_path):
    assert_stopped_at_step_4_and_resumes_exactly(tmp_path, signal.SIGTERM)


@pytest.mark.slow  # a training subprocess
def test_ctrl_c_saves_the_current_step_exits_130_and_resumes_exactly(tmp_path):
    assert_stopped_at_step_4_and_resumes_exactly(tmp_path, signal.SIGINT)


@pytest.mark.slow  # a training subprocess
def test_a_second_ctrl_c_stops_at_once_without_a_checkpoint(tmp_path):
    code, log = stop_training(tmp_path, signal.SIGINT, [], {}, again=True)
    assert code == 128 + signal.SIGINT, log[-3000:]
    assert "Ctrl-C again stops at once" in log and "Detected KeyboardInterrupt" in log
    assert "stopped by a signal" not in log and "Resume with:" not in log
    last = tmp_path / "stopped" / "checkpoints" / "last.ckpt"
    assert torch.load(last, map_location="cpu", weights_only=False)["global_step"] == 3  # the interval's


class LightningSigterm:
    """Stands in for Lightning's SIGTERM handler of a fit: records the signals that reach it."""

    def __init__(self):
        self.received: list[int] = []

    def __call__(self, signum: int, frame) -> None:
        self.received.append(signum)


def test_ctrl_c_raises_lightnings_stop_flag_and_a_second_one_stops_at_once():
    trainer = SimpleNamespace(strategy=SimpleNamespace(), is_global_zero=True)
    lightning = LightningSigterm()
    previous = signal.signal(signal.SIGTERM, lightning)
    try:
        with pytest.raises(SystemExit) as stopped, stop_on_signals(trainer):
            signal.raise_signal(signal.SIGINT)
            assert lightning.received == [signal.SIGTERM]  # the flag: the step goes on
            raise SIGTERMException  # what Lightning's loop raises after the step
        assert stopped.value.code == 128 + signal.SIGINT
        with pytest.raises(SystemExit) as stopped, stop_on_signals(trainer):
            signal.raise_signal(signal.SIGINT)
            signal.raise_signal(signal.SIGINT)  # at once: a KeyboardInterrupt here
            pytest.fail("the second Ctrl-C did not stop the run")
        assert stopped.value.code == 128 + signal.SIGINT and len(lightning.received) == 2
    except KeyboardInterrupt:
        pytest.fail("Ctrl-C escaped stop_on_signals")
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


@pytest.mark.slow  # a training subprocess
def test_slurms_requeue_signal_saves_the_current_step_and_requeues_the_job(tmp_path):
    bin_dir = tmp_path / "bin"  # a stand-in scontrol that records its arguments
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(f'#!/bin/sh\necho "$@" > {tmp_path / "scontrol.txt"}\n')
    (bin_dir / "scontrol").chmod(0o755)
    slurm = {"SLURM_JOB_ID": "4243", "SLURM_JOB_NAME": "mulo-test", "SLURM_NTASKS": "1",
             "SLURM_NTASKS_PER_NODE": "1", "SLURM_NNODES": "1", "SLURM_NODEID": "0", "SLURM_PROCID": "0",
             "SLURM_LOCALID": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
             "PATH": f"{bin_dir}:{os.environ['PATH']}"}  # fmt: skip
    code, log = stop_training(tmp_path, signal.SIGUSR1, ["trainer=slurm", "trainer.accelerator=cpu"], slurm)
    assert code == 128 + signal.SIGUSR1, log[-3000:]
    last = tmp_path / "stopped" / "checkpoints" / "last.ckpt"
    assert torch.load(last, map_location="cpu", weights_only=False)["global_step"] == 4
    assert "Resume with:" in log and "requeued SLURM job 4243" in log
    assert (tmp_path / "scontrol.txt").read_text() == "requeue 4243\n"
    assert not list((tmp_path / "stopped").glob("hpc_ckpt_*"))  # Lightning's own mid-step save stayed off
