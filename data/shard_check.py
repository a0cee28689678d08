"""Check a webdataset shard the way training reads it (`mulo-data verify`): decode every member of every
sample and list the samples training would skip or should not see.

- corrupt: a member does not decode, or the sample has neither an image nor a `.npy` token grid;
- too large: the image header gives a size beyond the limits the datamodule skips (image_limits.py); such
  an image is not decoded;
- no caption: no `.txt` member, or a blank one. A text-to-image target would train on the all-padding
  caption, so the modules that need captions skip such samples (`data.require_captions`).
"""

from __future__ import annotations

import io
import json
import os
import tarfile
from dataclasses import dataclass, field

import numpy as np
from mulo_sd.data.image_limits import ImageLimits
from PIL import Image
from webdataset.tariterators import base_plus_ext

IMAGE_EXTENSIONS = {"png", "jpg", "jpeg", "webp"}
CAPTION_EXTENSION = "txt"


@dataclass
class ShardReport:
    """What `check_shard` found: samples read, (key, reason) pairs of the corrupt, too large and uncaptioned
    samples, and why the tar is unreadable; a readable tar without samples is `empty`."""

    path: str
    samples: int = 0
    corrupt: list[tuple[str, str]] = field(default_factory=list)
    too_large: list[tuple[str, str]] = field(default_factory=list)
    uncaptioned: list[tuple[str, str]] = field(default_factory=list)
    unreadable: str | None = None

    @property
    def empty(self) -> bool:
        return self.unreadable is None and self.samples == 0


def _check_member(extension: str, data: bytes, limits: ImageLimits) -> str | None:
    """Decode one member the way a loader would; raises on bad content, returns why an image is too large."""
    kind = extension.rsplit(".", 1)[-1]
    if kind in IMAGE_EXTENSIONS:
        try:
            image = Image.open(io.BytesIO(data))  # reads the header only
        except Image.DecompressionBombError as error:  # PIL's own limit, far above the default max_pixels
            return str(error)
        with image:
            too_large = limits.problem(image.size)
            if too_large is None:
                image.load()
            return too_large
    if kind == "json":
        json.loads(data.decode("utf-8"))
    elif kind == CAPTION_EXTENSION:
        data.decode("utf-8")
    elif kind == "npy":
        np.load(io.BytesIO(data), allow_pickle=False)
    return None


def _caption_problem(members: dict[str, bytes]) -> str | None:
    if CAPTION_EXTENSION not in members:
        return f"no .{CAPTION_EXTENSION} member"
    if not members[CAPTION_EXTENSION].decode("utf-8").strip():
        return f"blank .{CAPTION_EXTENSION} member"
    return None


def _check_sample(
    report: ShardReport, key: str, members: dict[str, bytes], problem: str | None, limits: ImageLimits
) -> None:
    report.samples += 1
    if problem is not None:
        report.corrupt.append((key, problem))
        return
    too_large = None
    for extension in sorted(members):
        try:
            too_large = _check_member(extension, members[extension], limits) or too_large
        except Exception as error:  # any decoder failure makes the sample corrupt; say which member and why
            report.corrupt.append((key, f".{extension}: {type(error).__name__}: {error}"))
            return
    if too_large is not None:
        report.too_large.append((key, too_large))
        return
    kinds = {extension.rsplit(".", 1)[-1] for extension in members}
    if not kinds & (IMAGE_EXTENSIONS | {"npy"}):  # nothing to train on: the datamodule would skip it
        found = ", ".join(f".{extension}" for extension in sorted(members))
        report.corrupt.append(
            (key, f"no image ({'/'.join(sorted(IMAGE_EXTENSIONS))}) or .npy member, only {found}")
        )
        return
    caption = _caption_problem(members)
    if caption is not None:
        report.uncaptioned.append((key, caption))


def check_shard(path: str, limits: ImageLimits | None = None) -> ShardReport:
    """Read every sample of a shard (grouped by key as webdataset does) and decode each member; images
    beyond `limits` (default: the datamodule's defaults) are reported, not decoded."""
    limits = limits or ImageLimits()
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
                        _check_sample(report, key, members, problem, limits)
                    key, members, problem = member_key, {}, None
                extension = extension.lower()
                if extension in members:
                    problem = f"duplicate member {info.name}"
                members[extension] = data
        if key is not None:
            _check_sample(report, key, members, problem, limits)
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
