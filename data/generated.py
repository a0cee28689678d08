"""Folders of generated data (SynthScenes shards, token shards) that several runs may ask for at once.

Generated data lives in a cache shared by every run (conf/paths/default.yaml), so parallel runs, or the
ranks of one DDP run, can ask for the same folder at the same moment. `ensure_generated` lets one of them
generate it while the others wait on a lock file beside the folder (`.<name>.lock`), then reuse it. The
generating run writes into a hidden sibling (`.<name>.partial-*`) and renames it into place only when it is
complete, manifest included, so a killed run never leaves a folder that looks complete; the next run to take
the lock deletes such leftovers.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import tempfile
from collections.abc import Callable

from filelock import FileLock, Timeout


def ensure_generated(
    out: str, manifest_name: str, wanted: dict, generate: Callable[[str], None], what: str
) -> None:
    """Make sure folder `out` holds the data described by `wanted`, generating it when it is missing.

    `generate(folder)` writes the data into an empty folder; `wanted` is stored as `out/manifest_name` and a
    folder whose manifest differs is refused (`what` names the data in errors), never silently reused."""
    out = os.path.normpath(out)
    if has_manifest(out, manifest_name, wanted, what):  # complete folders appear atomically: no lock needed
        return
    parent, name = os.path.split(out)
    parent = parent or "."
    os.makedirs(parent, exist_ok=True)
    lock = FileLock(os.path.join(parent, f".{name}.lock"))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        print(f"waiting for another run to finish generating {out} (lock {lock.lock_file})", flush=True)
        lock.acquire()
    try:
        if has_manifest(out, manifest_name, wanted, what):  # the run we waited for made it
            return
        if os.path.exists(out) and not (os.path.isdir(out) and not os.listdir(out)):
            raise ValueError(
                f"{out} exists without {manifest_name}, so it is not complete {what} made on demand (an "
                "interrupted run of an older version?): delete it or change the output folder"
            )
        for stale in glob.glob(os.path.join(glob.escape(parent), glob.escape(f".{name}.partial-") + "*")):
            shutil.rmtree(stale)  # left by a killed run: we hold the lock, so nobody is writing there
        partial = tempfile.mkdtemp(prefix=f".{name}.partial-", dir=parent)
        try:
            generate(partial)
            with open(os.path.join(partial, manifest_name), "w") as f:
                json.dump(wanted, f, indent=1)
            os.replace(partial, out)  # atomic; replaces only an empty folder
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
    finally:
        lock.release()


def has_manifest(out: str, manifest_name: str, wanted: dict, what: str) -> bool:
    """Whether `out` is complete (has its manifest); raises when that manifest describes other data."""
    manifest = os.path.join(out, manifest_name)
    if not os.path.isfile(manifest):
        return False
    with open(manifest) as f:
        found = json.load(f)
    if found != wanted:
        raise ValueError(
            f"{out} holds {what} made with {found}, not {wanted}: delete it or change the output folder"
        )
    return True
