"""Webdataset shards: write them reproducibly, record their sizes, expand a shard spec (checking them:
shard_check.py).

Shards are plain tar files (webdataset's TarWriter) whose members are `<key>.<ext>`. Every tar header
field is fixed (mtime, owner, mode), so the same samples in the same order give byte-identical shards. Each
shard is written to `<name>.partial` and renamed into place when complete, so an interrupted run never
leaves a truncated shard under a shard's name.
`sizes.json` next to the shards maps each shard's file name to its sample count, the format open_clip
reads to know a dataset's length without scanning it.
"""

from __future__ import annotations

import contextlib
import glob
import itertools
import json
import os
from collections.abc import Iterable

import webdataset as wds
from braceexpand import braceexpand

SIZES_NAME = "sizes.json"
# Fixed tar header fields: the archive bytes depend only on the samples.
_TAR_HEADER = {"mtime": 0, "user": "mulo-sd", "group": "mulo-sd", "mode": 0o444}


def write_shards(
    samples: Iterable[dict], out_dir: str, prefix: str, shard_size: int, start_shard: int = 0
) -> dict[str, int]:
    """Write samples ({"__key__": str, ext: bytes, ...}) to out_dir/prefix-NNNNNN.tar, `shard_size` per shard.

    Returns {shard file name: sample count} for the shards written and merges it into out_dir/sizes.json
    (also when the samples raise: the shards finished before are listed, the unfinished one is deleted).
    """
    if shard_size < 1:
        raise ValueError(f"shard size must be >= 1, got {shard_size}")
    samples = iter(samples)
    first = next(samples, None)
    if first is None:
        raise ValueError(f"no samples to write to {out_dir}")
    os.makedirs(out_dir, exist_ok=True)
    sizes: dict[str, int] = {}
    try:
        for number in itertools.count(start_shard):
            name = f"{prefix}-{number:06d}.tar"
            shard = itertools.chain([first], itertools.islice(samples, shard_size - 1))
            sizes[name] = write_tar(os.path.join(out_dir, name), shard)
            first = next(samples, None)
            if first is None:
                break
    finally:  # also after a failure: the shards finished so far are complete
        if sizes:
            update_sizes(out_dir, sizes)
    return sizes


def write_tar(path: str, samples: Iterable[dict]) -> int:
    """Write samples to the tar file `path` via `path.partial`, renamed into place only when complete (a
    failure removes it); returns the number of samples."""
    partial = path + ".partial"
    count = 0
    try:
        with open(partial, "wb") as stream, wds.TarWriter(stream, encoder=False, **_TAR_HEADER) as writer:
            for sample in samples:
                writer.write(sample)
                count += 1
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(partial)
        raise
    os.replace(partial, path)
    return count


def update_sizes(out_dir: str, sizes: dict[str, int]) -> None:
    """Merge {shard file name: count} into out_dir/sizes.json, dropping entries whose shard is gone."""
    path = os.path.join(out_dir, SIZES_NAME)
    merged = {}
    if os.path.exists(path):
        with open(path) as f:
            merged = json.load(f)
    merged.update(sizes)
    merged = {name: merged[name] for name in sorted(merged) if os.path.exists(os.path.join(out_dir, name))}
    with open(path + ".partial", "w") as f:  # replaced at once: a run growing the folder may be reading it
        json.dump(merged, f, indent=1)
        f.write("\n")
    os.replace(path + ".partial", path)


def shard_spec(out_dir: str, shard_names: Iterable[str]) -> str:
    """Brace-expanded spec of consecutive shards `prefix-NNNNNN.tar`, e.g. dir/p-{000000..000009}.tar."""
    names = sorted(shard_names)
    prefix = names[0].rsplit("-", 1)[0]
    first, last = (name.rsplit("-", 1)[1].removesuffix(".tar") for name in (names[0], names[-1]))
    return os.path.join(out_dir, f"{prefix}-{{{first}..{last}}}.tar")


def expand_spec(spec: str) -> list[str]:
    """Shard paths of a brace-expanded spec (dir/p-{000000..000009}.tar) or of every *.tar in a directory."""
    if os.path.isdir(spec):
        paths = sorted(glob.glob(os.path.join(spec, "*.tar")))
        if not paths:
            raise ValueError(f"no .tar shards in directory {spec}")
        return paths
    return list(braceexpand(spec))
