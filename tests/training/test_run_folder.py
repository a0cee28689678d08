"""Run folders (training/run_folder.py, conf/hydra/default.yaml, training/csv_logger.py): a second live run is
refused (a second sweep into a multirun's sweep folder too), a dead one's lock does not block, default
folders are unique per launch, and a run resumed into its own folder keeps the metrics and Hydra files of the
launches before."""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import hydra
import lightning as L
import pytest
from mulo_sd.training.config import CONFIG_DIR
from mulo_sd.training.run_folder import (
    HYDRA_FILES,
    LOCK_FILE,
    RANK_VARIABLES,
    RunFolderBusy,
    RunFolderCallback,
    hold,
    release,
)
from mulo_sd.training.train import run
from omegaconf import OmegaConf

from tests.helpers import compose_train_config
from tests.training.test_train_vq import TINY_VQ

REPO = Path(__file__).resolve().parents[2]

HOLDER = (
    "import sys; from mulo_sd.training.run_folder import hold; hold(sys.argv[1]); print('held', flush=True); "
    "sys.stdin.read()"
)


def launcher_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in RANK_VARIABLES and not k.startswith("SLURM_")}


@pytest.fixture
def holder(tmp_path):
    """Another process holding the lock of tmp_path / "run"."""
    folder = tmp_path / "run"
    process = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(folder)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=launcher_env(),
    )  # fmt: skip
    assert process.stdout.readline().strip() == "held"
    yield folder, process
    process.kill()
    process.wait()


@pytest.fixture
def as_launcher(monkeypatch):
    for name in RANK_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def test_second_live_writer_is_refused_and_a_dead_holder_does_not_block(holder, as_launcher):
    folder, process = holder
    with pytest.raises(RunFolderBusy) as refused:
        hold(folder)
    message = str(refused.value)
    assert f"run folder {folder} is in use by pid {process.pid} on host " in message
    assert "hydra.run.dir=" in message and str(folder / LOCK_FILE) in message
    process.kill()  # a crash: the lock file still names the dead process
    process.wait()
    assert json.loads((folder / LOCK_FILE).read_text())["pid"] == process.pid
    hold(folder)  # a resume of the crashed run
    try:
        assert json.loads((folder / LOCK_FILE).read_text())["pid"] == os.getpid()
    finally:
        release(folder)


def test_nested_holds_keep_the_folder_until_the_last_release(tmp_path, as_launcher):
    folder = tmp_path / "run"
    probe = [sys.executable, "-c", HOLDER.replace("sys.stdin.read()", "pass"), str(folder)]

    def other_process_gets_it() -> bool:
        return subprocess.run(probe, capture_output=True, env=launcher_env()).returncode == 0

    hold(folder)
    hold(folder)  # the Hydra callback, then train.run, in one process
    release(folder)
    assert not other_process_gets_it()
    release(folder)
    assert other_process_gets_it()


def test_further_ranks_share_the_folder(holder, monkeypatch):
    folder, _ = holder
    monkeypatch.setenv("LOCAL_RANK", "1")  # a child of Lightning's DDP launcher, or a SLURM task
    hold(folder)
    release(folder)
    config = OmegaConf.create({"hydra": {"run": {"dir": str(folder)}, "output_subdir": ".hydra"}})
    RunFolderCallback().on_run_start(config)
    assert config.hydra.output_subdir is None  # the launcher alone writes the launch's .hydra files


def write_hydra_files(hydra_dir: Path, launch: str) -> None:
    hydra_dir.mkdir(parents=True, exist_ok=True)
    for name in HYDRA_FILES:
        (hydra_dir / name).write_text(launch)


def test_callback_keeps_each_launchs_hydra_files_and_refuses_a_busy_folder(tmp_path, as_launcher):
    folder = tmp_path / "run"
    config = OmegaConf.create({"hydra": {"run": {"dir": str(folder)}, "output_subdir": ".hydra"}})
    for launch in ("first", "second", "third"):
        callback = RunFolderCallback()
        callback.on_run_start(config)
        write_hydra_files(folder / ".hydra", launch)  # what Hydra does next
        callback.on_run_end(config)
    for number, launch in ((1, "first"), (2, "second")):
        for name in HYDRA_FILES:
            assert (folder / ".hydra" / f"launch-{number}" / name).read_text() == launch
    assert (folder / ".hydra" / "overrides.yaml").read_text() == "third"

    other = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(folder)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env=launcher_env(),
    )  # fmt: skip
    try:
        assert other.stdout.readline().strip() == "held"
        with pytest.raises(SystemExit, match=f"run folder {folder} is in use by pid {other.pid}"):
            RunFolderCallback().on_run_start(config)  # Hydra would only warn about any other exception
    finally:
        other.kill()
        other.wait()
    assert not (folder / ".hydra" / "launch-3").exists()


def test_callback_locks_the_sweep_folder_for_the_whole_multirun(tmp_path, as_launcher):
    sweep = tmp_path / "sweep"
    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep)}}})
    probe = [sys.executable, "-c", HOLDER.replace("sys.stdin.read()", "pass"), str(sweep)]

    def other_process_gets_it() -> bool:
        return subprocess.run(probe, capture_output=True, env=launcher_env()).returncode == 0

    callback = RunFolderCallback()
    callback.on_multirun_start(config)  # before Hydra writes multirun.yaml and the first job's folder
    assert not other_process_gets_it()
    callback.on_multirun_end(config)
    assert other_process_gets_it()

    other = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(sweep)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env=launcher_env(),
    )  # fmt: skip
    try:
        assert other.stdout.readline().strip() == "held"
        expected = rf"sweep folder {sweep} is in use by pid {other.pid} .*\(hydra\.sweep\.dir=\)"
        with pytest.raises(SystemExit, match=expected):
            RunFolderCallback().on_multirun_start(config)
    finally:
        other.kill()
        other.wait()


def test_default_run_folders_are_unique_per_launch(tmp_path, monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    with hydra.initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = hydra.compose("train", overrides=[f"paths.log_dir={tmp_path}"], return_hydra_config=True)
    name = Path(cfg.hydra.run.dir).relative_to(tmp_path / "train").as_posix()
    # two runs started in the same second differ by their pids; names sort by time
    assert re.fullmatch(rf"\d{{4}}-\d\d-\d\d_\d\d-\d\d-\d\d_{os.getpid()}", name), name
    assert Path(cfg.hydra.sweep.dir).name == f"multirun_{name}"


def metric_steps(run_dir: Path, name: str) -> list[int]:
    with open(run_dir / "csv" / "metrics.csv") as f:
        return [int(row["step"]) for row in csv.DictReader(f) if row.get(name)]


def test_resume_into_the_same_folder_appends_to_the_metrics(tmp_path):
    common = [*TINY_VQ, "trainer.val_check_interval=100", "callbacks.checkpoint.every_n_train_steps=100"]
    run(compose_train_config(tmp_path, [*common, "trainer.max_steps=2"]))
    run_dir = tmp_path / "run"
    assert metric_steps(run_dir, "train/loss") == [0, 1]
    resume = [*common, "trainer.max_steps=4", f"ckpt_path={run_dir}/checkpoints/last.ckpt"]
    run(compose_train_config(tmp_path, resume))
    assert metric_steps(run_dir, "train/loss") == [0, 1, 2, 3]
    assert metric_steps(run_dir, "val/psnr_32") == [2, 4]  # each launch's final validation


def mulo_train(run_dir: Path, data_dir: Path, *overrides: str) -> subprocess.Popen:
    args = [*TINY_VQ, f"paths.data_dir={data_dir}", f"hydra.run.dir={run_dir}", *overrides]
    return subprocess.Popen(
        ["mulo-train", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=launcher_env()
    )


def wait_for_lock(run_dir: Path, process: subprocess.Popen) -> None:
    """Until `process` holds the lock of run_dir (the file may still name the launch before)."""
    lock = run_dir / LOCK_FILE
    while not (lock.is_file() and f'"pid": {process.pid},' in lock.read_text()):
        assert process.poll() is None, process.stdout.read()
        time.sleep(0.2)


@pytest.mark.slow
def test_mulo_train_resumes_into_its_folder_and_refuses_a_second_live_run(tmp_path):
    run_dir, data_dir = tmp_path / "run", tmp_path / "data"
    common = ["trainer.val_check_interval=100000", "callbacks.checkpoint.every_n_train_steps=100000"]
    first = mulo_train(run_dir, data_dir, *common, "trainer.max_steps=2")
    assert first.wait() == 0, first.stdout.read()
    resume = f"ckpt_path={run_dir}/checkpoints/last.ckpt"
    resumed = mulo_train(run_dir, data_dir, *common, "trainer.max_steps=100000", resume)
    wait_for_lock(run_dir, resumed)
    second = mulo_train(run_dir, data_dir, *common, "trainer.max_steps=3")
    refused = second.stdout.read()
    assert second.wait() == 1
    assert f"error: run folder {run_dir} is in use by pid {resumed.pid} on host " in refused
    resumed.send_signal(signal.SIGTERM)  # Lightning stops after the current step and writes its logs
    resumed.wait()
    steps = metric_steps(run_dir, "train/loss")
    assert len(steps) > 2 and steps == list(range(len(steps)))  # both launches, nothing from the refused one
    overrides = [OmegaConf.load(run_dir / ".hydra" / sub / "overrides.yaml") for sub in ("launch-1", ".")]
    assert "trainer.max_steps=2" in overrides[0] and resume not in overrides[0]
    assert "trainer.max_steps=100000" in overrides[1] and resume in overrides[1]
    assert not (run_dir / ".hydra" / "launch-2").exists()  # the refused run moved and wrote nothing


def outputs(*processes: subprocess.Popen) -> list[str]:
    return [process.communicate()[0] for process in processes]


RACE_STEPS = 60


@pytest.mark.slow
def test_two_runs_started_seconds_apart_into_one_folder_the_second_is_refused_before_training(tmp_path):
    run_dir, data_dir = tmp_path / "run", tmp_path / "data"
    common = ["trainer.val_check_interval=100000", "callbacks.checkpoint.every_n_train_steps=100000"]
    # RACE_STEPS: the winner still trains when the other reaches the lock, on idle cores too (with 3 steps the
    # first could finish before the second had imported: both ran, one after the other)
    runs = [mulo_train(run_dir, data_dir, *common, f"trainer.max_steps={RACE_STEPS}", "seed=1")]
    time.sleep(2)  # the first is still importing: neither has the lock yet
    runs.append(mulo_train(run_dir, data_dir, *common, f"trainer.max_steps={RACE_STEPS}", "seed=2"))
    texts = outputs(*runs)
    codes = [process.returncode for process in runs]
    assert sorted(codes) == [0, 1], texts  # whichever of the two locked the folder first trains
    winner, loser = (0, 1) if codes[0] == 0 else (1, 0)
    refused = texts[loser]
    assert f"error: run folder {run_dir} is in use by pid {runs[winner].pid} on host " in refused
    assert "GPU available" not in refused  # it stopped before building its Trainer
    assert metric_steps(run_dir, "train/loss") == list(range(RACE_STEPS))  # one run's steps, once
    assert f"seed={winner + 1}" in OmegaConf.load(run_dir / ".hydra" / "overrides.yaml")
    assert not (run_dir / ".hydra" / "launch-1").exists()  # the refused run moved and wrote nothing


class WaitForRelease(L.Callback):
    """At the start of training creates `marker`, then waits until `release` exists (at most `timeout` s),
    so that a test acts while the run is at a known point."""

    def __init__(self, marker: str, release: str, timeout: float = 120.0):
        self.marker, self.release, self.timeout = Path(marker), Path(release), timeout

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.marker.touch()
        deadline = time.monotonic() + self.timeout
        while not self.release.exists() and time.monotonic() < deadline:
            time.sleep(0.05)


def mulo_train_sweep(sweep_dir: Path, data_dir: Path, seeds: str, *overrides: str) -> subprocess.Popen:
    """A multirun over `seed=<seeds>` of 2 steps a job into `sweep_dir` (`python -m`: the tests import)."""
    args = [*TINY_VQ, f"paths.data_dir={data_dir}", f"hydra.sweep.dir={sweep_dir}", f"seed={seeds}",
            "trainer.max_steps=2", "trainer.val_check_interval=100000",
            "callbacks.checkpoint.every_n_train_steps=100000", *overrides]  # fmt: skip
    return subprocess.Popen(
        [sys.executable, "-m", "mulo_sd.training.train", "-m", *args], cwd=REPO, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, env=launcher_env(),
    )  # fmt: skip


@pytest.mark.slow
def test_a_second_sweep_into_one_sweep_folder_is_refused_before_its_first_job(tmp_path):
    sweep, data_dir, started, release = tmp_path / "sweep", tmp_path / "data", tmp_path / "a", tmp_path / "b"
    wait = [f"+callbacks.wait._target_={__name__}.WaitForRelease", f"+callbacks.wait.marker={started}",
            f"+callbacks.wait.release={release}"]  # fmt: skip
    first = mulo_train_sweep(sweep, data_dir, "1,2", *wait)  # its first job waits in training
    while not started.exists():
        assert first.poll() is None, first.stdout.read()
        time.sleep(0.2)
    second = mulo_train_sweep(sweep, data_dir, "3,4")
    refused = second.communicate()[0]
    release.touch()
    assert second.returncode == 1, refused
    assert f"error: sweep folder {sweep} is in use by pid {first.pid} on host " in refused
    assert "hydra.sweep.dir=" in refused and "GPU available" not in refused  # before its first job
    assert first.wait() == 0, first.stdout.read()
    assert "seed=1,2" in OmegaConf.load(sweep / "multirun.yaml").hydra.overrides.task
    for job, seed in (("0", 1), ("1", 2)):  # the first sweep's jobs, nothing of the second's
        assert f"seed={seed}" in OmegaConf.load(sweep / job / ".hydra" / "overrides.yaml")
        assert metric_steps(sweep / job, "train/loss") == [0, 1]
    assert sorted(p.name for p in sweep.iterdir() if p.is_dir()) == ["0", "1"]
