"""Folders of generated data (SynthScenes shards, token shards) that several runs may ask for at once, and
that grow when a later run needs more of them than an earlier one did.

Generated data lives in a cache shared by every run (conf/paths/default.yaml), so parallel runs, or the
ranks of one DDP run, can ask for the same folder at the same moment. A folder's manifest records what the
data is (its identity: a folder of other data is refused, never reused) and how far it is generated (its
progress: scenes rendered, shards tokenised). `ensure_generated` lets one run generate what is missing while
the others wait on a lock file beside the folder (`.<name>.lock`), then reuse it:
- the first run writes into a hidden sibling (`.<name>.partial-*`) and renames it into place only when it is
  complete, manifest included; the next run to take the lock deletes what a killed first run left;
- a later run that needs more adds its files beside the existing ones (each shard renamed into place when
  complete) and only then replaces the manifest, atomically; a killed extension leaves files the manifest
  does not claim, which no run reads and the next extension overwrites.
So a manifest never claims data that a killed run left unfinished, and files it claims never change.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from filelock import FileLock, Timeout


@dataclass(frozen=True)
class GrowingData:
    """What a run asks of a folder of generated data.

    The manifest (`manifest_name`) is `identity` plus `progress_key: progress`. `covers(progress)` says
    whether a folder generated this far holds what the run reads (progress None: a manifest without the key,
    written before folders grew). `generate(folder, progress)` adds the rest to `folder` (an empty new folder
    when `progress` is None) and returns the new progress. `what` names the data in messages."""

    manifest_name: str
    identity: dict
    progress_key: str
    covers: Callable[[Any], bool]
    generate: Callable[[str, Any], Any]
    what: str


def ensure_generated(out: str, data: GrowingData) -> None:
    """Make sure folder `out` holds what `data` asks for, generating the missing part (module docstring)."""
    out = os.path.normpath(out)
    if covered(out, data):  # manifests appear and change atomically: no lock needed
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
        if covered(out, data):  # the run we waited for made it
            return
        manifest = read_manifest(out, data)
        if manifest is None:
            generate_new(out, parent, name, data)
        else:  # grow in place: the files the manifest claims stay as they are
            progress = data.generate(out, manifest.get(data.progress_key))
            write_manifest(out, data, progress)
    finally:
        lock.release()


def generate_new(out: str, parent: str, name: str, data: GrowingData) -> None:
    """Generate the new folder `out` in a hidden sibling renamed into place when complete (under the lock)."""
    if os.path.exists(out) and not (os.path.isdir(out) and not os.listdir(out)):
        raise ValueError(
            f"{out} exists without {data.manifest_name}, so it is not complete {data.what} made on demand "
            "(an interrupted run of an older version?): delete it or change the output folder"
        )
    for stale in glob.glob(os.path.join(glob.escape(parent), glob.escape(f".{name}.partial-") + "*")):
        shutil.rmtree(stale)  # left by a killed run: we hold the lock, so nobody is writing there
    partial = tempfile.mkdtemp(prefix=f".{name}.partial-", dir=parent)
    try:
        write_manifest(partial, data, data.generate(partial, None))
        os.replace(partial, out)  # atomic; replaces only an empty folder
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise


def covered(out: str, data: GrowingData) -> bool:
    """Whether `out` already holds what `data` asks for; raises when its manifest describes other data."""
    manifest = read_manifest(out, data)
    return manifest is not None and data.covers(manifest.get(data.progress_key))


def read_manifest(out: str, data: GrowingData) -> dict | None:
    """The manifest of `out` (None when it has none); raises when its identity is not `data.identity`."""
    path = os.path.join(out, data.manifest_name)
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        manifest = json.load(f)
    identity = {key: value for key, value in manifest.items() if key != data.progress_key}
    if identity != data.identity:
        raise ValueError(
            f"{out} holds {data.what} made with {identity}, not {data.identity}: delete it or change the "
            "output folder"
        )
    return manifest


def write_manifest(folder: str, data: GrowingData, progress: Any) -> None:
    """Write the manifest via a temporary file, so readers see the old one or the new one, never half."""
    path = os.path.join(folder, data.manifest_name)
    with open(path + ".partial", "w") as f:
        json.dump({**data.identity, data.progress_key: progress}, f, indent=1)
    os.replace(path + ".partial", path)
