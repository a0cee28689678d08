"""Webdataset shards: write them reproducibly, record their sizes, expand a shard spec, check them.

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
import io
import itertools
import json
import os
import tarfile
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import webdataset as wds
from braceexpand import braceexpand
from PIL import Image
from webdataset.tariterators import base_plus_ext

SIZES_NAME = "sizes.json"
IMAGE_EXTENSIONS = {"png", "jpg", "jpeg", "webp"}
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
    with open(path, "w") as f:
        json.dump(merged, f, indent=1)
        f.write("\n")


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


@dataclass
class ShardReport:
    """What `check_shard` found: samples read, corrupt (key, reason) pairs, and why the tar is unreadable.

    A sample is corrupt when a member does not decode, or when it has neither an image nor a `.npy` token
    grid (pre-tokenised shards); a readable tar without samples is `empty`."""

    path: str
    samples: int = 0
    corrupt: list[tuple[str, str]] = field(default_factory=list)
    unreadable: str | None = None

    @property
    def empty(self) -> bool:
        return self.unreadable is None and self.samples == 0


def _check_member(extension: str, data: bytes) -> None:
    """Decode one member the way a loader would; raises on bad content."""
    kind = extension.rsplit(".", 1)[-1]
    if kind in IMAGE_EXTENSIONS:
        with Image.open(io.BytesIO(data)) as image:
            image.load()
    elif kind == "json":
        json.loads(data.decode("utf-8"))
    elif kind == "txt":
        data.decode("utf-8")
    elif kind == "npy":
        np.load(io.BytesIO(data), allow_pickle=False)


def _check_sample(report: ShardReport, key: str, members: dict[str, bytes], problem: str | None) -> None:
    report.samples += 1
    if problem is not None:
        report.corrupt.append((key, problem))
        return
    for extension in sorted(members):
        try:
            _check_member(extension, members[extension])
        except Exception as error:  # any decoder failure makes the sample corrupt; say which member and why
            report.corrupt.append((key, f".{extension}: {type(error).__name__}: {error}"))
            return
    kinds = {extension.rsplit(".", 1)[-1] for extension in members}
    if not kinds & (IMAGE_EXTENSIONS | {"npy"}):  # nothing to train on: the datamodule would skip it
        found = ", ".join(f".{extension}" for extension in sorted(members))
        report.corrupt.append(
            (key, f"no image ({'/'.join(sorted(IMAGE_EXTENSIONS))}) or .npy member, only {found}")
        )


def check_shard(path: str) -> ShardReport:
    """Read every sample of a shard (grouped by key as webdataset does) and decode each member."""
    report = ShardReport(path)
    if not os.path.isfile(path):
        report.unreadable = "no such file"
        return report
    key, members, problem = None, {}, None
    try:
        with tarfile.open(path, mode="r|") as archive:
            for info in archive:
                member_key, extension = base_plus_ext(info.name)
                if not info.isfile() or member_key is None:
                    continue
                data = archive.extractfile(info).read()
                if member_key != key:
                    if key is not None:
                        _check_sample(report, key, members, problem)
                    key, members, problem = member_key, {}, None
                extension = extension.lower()
                if extension in members:
                    problem = f"duplicate member {info.name}"
                members[extension] = data
        if key is not None:
            _check_sample(report, key, members, problem)
        _check_end_of_archive(path)
    except (tarfile.TarError, OSError, EOFError) as error:
        report.unreadable = f"{type(error).__name__}: {error} (truncated or not a tar file?)"
    return report


def _check_end_of_archive(path: str) -> None:
    """A tar cut at a member boundary reads without error; its missing zero end blocks give it away."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        f.seek(max(0, size - 1024))
        tail = f.read()
    if size % 512 or len(tail) < 1024 or any(tail):
        raise tarfile.ReadError("missing end-of-archive blocks")
