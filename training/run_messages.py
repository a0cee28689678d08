"""What `mulo-train` tells its user on stdout (training/train.py): where the run writes, when it starts and
when it ends, and where the exported model is. Only the launcher prints: the further ranks of a DDP run run
the same code (training/run_folder.py, `is_launcher`).
"""

from __future__ import annotations

import os

from mulo_sd.training.run_folder import is_launcher


def print_run_start(folder: str | os.PathLike) -> None:
    if is_launcher():
        print(f"run folder (checkpoints, logs): {os.path.abspath(folder)}", flush=True)


def print_run_end(folder: str | os.PathLike, export: str | os.PathLike | None) -> None:
    """The run folder again, and the exported model's folder when `export` is set."""
    if is_launcher():
        print(f"done; run folder: {os.path.abspath(folder)}", flush=True)
        if export:
            print(f"exported model: {os.path.abspath(export)}", flush=True)
