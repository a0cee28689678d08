"""Images read from disk for the metrics and the image grid, in batches, as the uint8 tensors torchmetrics'
metrics take (FID's resizing protocols: fid_protocols.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageOps

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp")


def image_files(folder: str | Path) -> list[Path]:
    """Every image file under `folder` (subfolders too), sorted; none is an error naming the folder."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"image folder not found: {folder}")
    files = sorted(p for p in folder.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
    if not files:
        raise ValueError(f"no image files ({', '.join(IMAGE_SUFFIXES)}) under {folder}")
    return files


def load_image(path: str | Path, size: int | None = None) -> torch.Tensor:
    """uint8 [3, H, W]; with `size`, centre-cropped to a square and resized to size x size (bicubic), the
    usual way a reference set of any shape meets square generated images."""
    with Image.open(path) as image:
        image = image.convert("RGB")
        if size is not None and image.size != (size, size):
            image = ImageOps.fit(image, (size, size), Image.Resampling.BICUBIC)
        return torch.from_numpy(np.asarray(image).copy()).permute(2, 0, 1)


def image_batches(paths: list[Path], batch_size: int, size: int | None = None) -> Iterator[torch.Tensor]:
    """uint8 [B, 3, H, W] batches of the images at `paths`, in order."""
    for start in range(0, len(paths), batch_size):
        yield torch.stack([load_image(path, size) for path in paths[start : start + batch_size]])
