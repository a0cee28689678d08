"""The run folder of a launch (`mulo-train`, `mulo-eval`, `mulo-decode`): a lock that keeps a second live
writer out from start-up to the end of the run (a multirun's sweep folder for the whole sweep), and the
earlier launches' Hydra files kept when a launch resumes into the same folder. (The default folder's unique
name is `${job_or_time:...}` of training/config.py.)

Only the launcher process takes the lock: the further ranks of a DDP run (Lightning's script launcher,
torchrun, SLURM tasks) write into the same folder on purpose. The kernel drops the lock when its holder
exits, so the folder of a crashed or killed run is free for its resume; `run.lock` keeps the last holder's
pid and host for the error message.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import socket
import sys
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, read_write

log = logging.getLogger(__name__)

LOCK_FILE = "run.lock"
SWEEP_KNOB = "hydra.sweep.dir"
HYDRA_FILES = ("config.yaml", "hydra.yaml", "overrides.yaml")
# set to a non-zero value in the processes of further ranks by Lightning's launcher, torchrun and SLURM
RANK_VARIABLES = ("RANK", "LOCAL_RANK", "NODE_RANK", "SLURM_PROCID")


def is_launcher() -> bool:
    """Whether this process is the one that was started for rank 0 (not a further rank of a DDP run)."""
    return all(os.environ.get(name, "0") == "0" for name in RANK_VARIABLES)


class RunFolderBusy(RuntimeError):
    """Another live process writes into the run folder."""


_held: dict[str, list[int]] = {}  # folder -> [lock file descriptor, nested holds in this process]


def hold(folder: str | os.PathLike, knob: str = "hydra.run.dir") -> None:
    """Lock `folder` (created if missing) for this process; nested holds by one process are allowed. Raises
    RunFolderBusy naming the holder, and `knob` (the setting that names another folder), when another live
    process has it. Does nothing in further ranks."""
    if not is_launcher():
        return
    key = os.path.realpath(folder)
    if key in _held:
        _held[key][1] += 1
        return
    os.makedirs(key, exist_ok=True)
    path = os.path.join(key, LOCK_FILE)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as err:
        holder = os.read(fd, 4096).decode(errors="replace")
        os.close(fd)
        if err.errno in (errno.EAGAIN, errno.EWOULDBLOCK):
            raise RunFolderBusy(busy_message(key, path, holder, knob)) from None
        # a file system without locks: run, but say that nothing guards the folder
        log.warning("cannot lock %s (%s): nothing keeps a second run out of this folder", path, err)
        return
    os.ftruncate(fd, 0)
    since = f"{datetime.now():%Y-%m-%d %H:%M:%S}"
    record = {"pid": os.getpid(), "host": socket.gethostname(), "since": since, "command": " ".join(sys.argv)}
    os.write(fd, (json.dumps(record) + "\n").encode())
    _held[key] = [fd, 1]


def busy_message(folder: str, path: str, holder: str, knob: str) -> str:
    try:
        who = json.loads(holder)
        who = f"pid {who['pid']} on host {who['host']} since {who['since']}: {who['command']}"
    except (ValueError, KeyError):
        who = "a process that has not written its name yet"
    what = "sweep folder" if knob == SWEEP_KNOB else "run folder"
    return (
        f"{what} {folder} is in use by {who}. Two runs writing one folder overwrite each other's "
        f"checkpoints and logs: wait for that run to end, or give this one another folder ({knob}=). "
        f"The lock is {path}; the kernel releases it when its holder exits."
    )


def release(folder: str | os.PathLike) -> None:
    """Undo one `hold` of `folder`; the last one unlocks it (the file stays: removing it would let a waiting
    process lock a file that a third process no longer sees)."""
    key = os.path.realpath(folder)
    if key not in _held:
        return
    _held[key][1] -= 1
    if _held[key][1] == 0:
        fd, _ = _held.pop(key)
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


@contextlib.contextmanager
def holding(folder: str | os.PathLike) -> Iterator[None]:
    hold(folder)
    try:
        yield
    finally:
        release(folder)


def keep_previous_launch(hydra_dir: Path) -> Path | None:
    """Move the Hydra files of the folder's previous launch into `hydra_dir/launch-<n>` (n: that launch's
    number, from 1) before Hydra writes this launch's; return the folder they went to, or None."""
    files = [hydra_dir / name for name in HYDRA_FILES if (hydra_dir / name).is_file()]
    if not files:
        return None
    number = 1 + sum(1 for p in hydra_dir.glob("launch-*") if p.is_dir())
    target = hydra_dir / f"launch-{number}"
    target.mkdir()
    for file in files:
        os.replace(file, target / file.name)
    return target


class RunFolderCallback(Callback):
    """Hydra callback (conf/hydra/default.yaml): locks the run folder and keeps the previous launch's Hydra
    files, both before Hydra writes `.hydra/` for this launch. A multirun's sweep folder is locked for the
    whole sweep, before Hydra writes its multirun.yaml and the first job's folder, so two sweeps into one
    `hydra.sweep.dir` cannot mix their jobs (each job's folder is locked by `mulo_sd.training.train.run`
    too)."""

    def __init__(self) -> None:
        self.folder: Path | None = None

    def on_run_start(self, config: DictConfig, **kwargs) -> None:
        if not is_launcher():
            # the launcher writes the launch's .hydra files, and further ranks (SLURM tasks) would race it;
            # Lightning's launcher passes the same setting to its ranks
            with read_write(config.hydra):
                config.hydra.output_subdir = None
            return
        self.take(config.hydra.run.dir, "hydra.run.dir")
        if config.hydra.output_subdir is not None:
            keep_previous_launch(self.folder / config.hydra.output_subdir)

    def on_run_end(self, config: DictConfig, **kwargs) -> None:
        self.give_back()

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        if is_launcher():
            self.take(config.hydra.sweep.dir, SWEEP_KNOB)

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        self.give_back()

    def take(self, folder: str, knob: str) -> None:
        try:
            hold(folder, knob)
        except RunFolderBusy as err:  # Hydra turns a callback's exceptions into warnings, and goes on
            raise SystemExit(f"error: {err}") from None
        self.folder = Path(folder)

    def give_back(self) -> None:
        if self.folder is not None:
            release(self.folder)
            self.folder = None
