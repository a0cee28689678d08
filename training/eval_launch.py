"""What `mulo-eval` checks and holds before anything loads (`checked_launch`, around its `run(cfg)`): the
seeds (`seeds`, `fd_ar.seeds`: training/seeds.py), and `out_dir`, locked for the run's length with the run
folder's lock (training/run_folder.py), so a second evaluation into the same folder is refused naming it.
The further ranks of a multi-process run share the folder (only the launcher's process takes the lock); a
rerun into the folder once the first has ended resumes it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

from mulo_sd.training.run_folder import RunFolderBusy, hold, release
from mulo_sd.training.seeds import check_seeds
from omegaconf import DictConfig


def checked_launch(run: Callable[[DictConfig], object]) -> Callable[[DictConfig], object]:
    """`run`, with the seeds checked first and `cfg.out_dir` held while it runs (module docstring)."""

    @functools.wraps(run)
    def launch(cfg: DictConfig):
        check_seeds(cfg.seeds, "seeds")
        check_seeds((cfg.get("fd_ar") or {}).get("seeds"), "fd_ar.seeds")
        out_dir = Path(str(cfg.out_dir))
        try:
            hold(out_dir)
        except RunFolderBusy as error:
            raise RunFolderBusy(
                f"out_dir={out_dir}: another evaluation writes there; give this one another out_dir= (a "
                f"rerun with this one resumes once it has ended). {error}"
            ) from None
        try:
            return run(cfg)
        finally:
            release(out_dir)

    return launch
