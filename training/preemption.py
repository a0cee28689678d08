"""A training run stopped by SIGTERM or by SLURM's requeue signal keeps every step it took.

Lightning's signal connector turns SIGTERM into a flag that ends the fit with `SIGTERMException` once the
current step is done (its checkpoint and validation included). `CheckpointOnStop` then writes last.ckpt of
that step, which resumes exactly like any step checkpoint, and logs the command that resumes it;
`stop_on_signals` makes the run exit non-zero (128 + the signal's number, as if killed by it).

Ctrl-C (SIGINT) stops the run the same way (exit 130); a second Ctrl-C stops it at once, through Lightning's
KeyboardInterrupt path, without a checkpoint of the current step (exit 130 too).

SLURM's requeue signal (`trainer=slurm`: SLURMEnvironment's `requeue_signal` with `auto_requeue`) stops the
run the same way, then requeues the job. It is handled here rather than by Lightning's auto-requeue handler,
which writes its checkpoint inside the signal handler, at whatever point of a step the signal arrives; while
this handler is installed Lightning leaves that signal alone. See docs/training_at_scale.md.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import lightning as L
from hydra.core.hydra_config import HydraConfig
from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.exceptions import SIGTERMException
from mulo_sd.training.accumulation import ends_accumulation

log = logging.getLogger(__name__)


def resume_command(ckpt_path: Path) -> str:
    """The `mulo-train` command line of this run (its overrides) resuming from `ckpt_path`."""
    overrides = list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else sys.argv[1:]
    kept = [o for o in overrides if o.split("=", 1)[0].lstrip("+~") != "ckpt_path"]
    return shlex.join(["mulo-train", *kept, f"ckpt_path={ckpt_path}"])


class CheckpointOnStop(L.Callback):
    """On a stop signal during training, writes last.ckpt of the current step in each checkpoint folder
    (ModelCheckpoint with save_last=true) and logs how to resume from it.

    With gradient accumulation the stop waits for the window's last micro-batch: a checkpoint inside a window
    would lose the gradients gathered so far. Lightning has no public way to defer its SIGTERM flag, so this
    holds `trainer._signal_connector.received_sigterm` (Lightning 2.6) until then."""

    def __init__(self):
        self.held = False  # a stop signal received inside an accumulation window

    def on_train_batch_end(self, trainer: L.Trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        stop = trainer.received_sigterm or self.held
        self.held = stop and not ends_accumulation(trainer)
        trainer._signal_connector.received_sigterm = stop and not self.held

    def on_exception(self, trainer: L.Trainer, pl_module, exception: BaseException) -> None:
        if not isinstance(exception, SIGTERMException) or trainer.state.fn != TrainerFn.FITTING:
            return
        if not ends_accumulation(trainer):  # the signal came after this micro-batch's check
            log.warning("stopped inside an accumulation window: resuming from this checkpoint is not exact")
        saved = []
        for callback in trainer.checkpoint_callbacks:
            # save_last="link": last.ckpt points at a step file, which writing through it would overwrite
            if callback.save_last is True and callback.dirpath:
                path = Path(callback.dirpath) / f"{callback.CHECKPOINT_NAME_LAST}.ckpt"
                # saved with the checkpoint: a run resumed in this folder then writes its own last.ckpt here,
                # not last-v1.ckpt beside it
                callback.last_model_path = str(path)
                trainer.save_checkpoint(path)  # on every rank: it synchronises them
                saved.append(path)
        if not trainer.is_global_zero:
            return
        if not saved:
            log.warning("stopped at step %d; no checkpoint written (no ModelCheckpoint with save_last=true)",
                        trainer.global_step)  # fmt: skip
            return
        log.warning(
            "stopped by a signal at step %d; saved %s. Resume with:\n%s",
            trainer.global_step,
            saved[0],
            resume_command(saved[0].resolve()),
        )


def requeue_slurm_job() -> None:
    """`scontrol requeue` this SLURM job (an array job's task by its array ids); a failure is logged."""
    array_job = os.environ.get("SLURM_ARRAY_JOB_ID")
    job = f"{array_job}_{os.environ['SLURM_ARRAY_TASK_ID']}" if array_job else os.environ["SLURM_JOB_ID"]
    try:
        result = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True)
    except FileNotFoundError:
        log.error("cannot requeue SLURM job %s: no scontrol on this machine", job)
        return
    if result.returncode:
        log.error("scontrol requeue %s failed (%d): %s", job, result.returncode, result.stderr.strip())
    else:
        log.warning("requeued SLURM job %s", job)


def requeue_signal(trainer: L.Trainer) -> int | None:
    """The signal on which SLURM requeues this run (`trainer=slurm`), or None; SIGTERM is a plain stop."""
    environment = getattr(trainer.strategy, "cluster_environment", None)
    if isinstance(environment, SLURMEnvironment) and environment.auto_requeue:
        return None if environment.requeue_signal == signal.SIGTERM else environment.requeue_signal
    return None


def lightning_listens() -> bool:
    """Whether Lightning's SIGTERM handler, which turns SIGTERM into its stop flag, is in place (it is inside
    fit and validate only)."""
    return signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, signal.SIG_IGN, None)


@contextlib.contextmanager
def stop_on_signals(trainer: L.Trainer) -> Iterator[None]:
    """Around the trainer's fit / validate calls: a run stopped by SIGTERM exits with 128 + 15, by Ctrl-C with
    128 + 2 (a second Ctrl-C stops at once); with a SLURM environment that requeues, its requeue signal stops
    the run like SIGTERM, and rank 0 then requeues the job (exit 128 + that signal's number)."""
    requeue = requeue_signal(trainer)
    handled = [signal.SIGINT, *([requeue] if requeue else [])]
    if threading.current_thread() is not threading.main_thread():
        handled = []  # only the main thread may set signal handlers
    received: list[int] = []
    pid = os.getpid()

    def on_stop_signal(signum: int, frame) -> None:
        # forked DataLoader workers inherit the handler, and SLURM's signal and a Ctrl-C reach them too
        if os.getpid() != pid:
            return
        received.append(signum)
        if signum == signal.SIGINT and (received.count(signum) > 1 or not lightning_listens()):
            raise KeyboardInterrupt  # a second Ctrl-C, or one outside fit / validate: stop at once
        if signum == signal.SIGINT and trainer.is_global_zero:
            log.warning("Ctrl-C: stopping after this step with a checkpoint; Ctrl-C again stops at once")
        signal.raise_signal(signal.SIGTERM)  # Lightning's SIGTERM flag: stop after this step

    previous = {signum: signal.signal(signum, on_stop_signal) for signum in handled}
    try:
        yield
    except SIGTERMException as stop:
        signum = received[0] if received else signal.SIGTERM
        if signum == requeue and trainer.is_global_zero:
            requeue_slurm_job()
        raise SystemExit(128 + signum) from stop
    except KeyboardInterrupt as stop:  # a second Ctrl-C during Lightning's stop
        raise SystemExit(128 + signal.SIGINT) from stop
    except SystemExit as stop:
        if signal.SIGINT in received and stop.code == 1:  # Lightning ends a KeyboardInterrupt with exit(1)
            raise SystemExit(128 + signal.SIGINT) from stop
        raise
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)
