"""How an image becomes the FID Inception's input: the resizing protocols of published FID numbers
(docs/real_evaluation.md section 4). The same protocol is applied to the generated and the reference images.

- `llamagen` (the default): LlamaGen's text-to-image evaluation (FoundationVision/LlamaGen,
  evaluations/t2i/evaluation.py, taken from GigaGAN): each image is centre-cropped to a square (its long edge
  cut to its short one), resized to the evaluation resolution with PIL's LANCZOS (256 px in their runs), then
  clean-fid's `clean` resize to 299 x 299: PIL bicubic on each channel as a float32 image.
- `clean`: clean-fid's own `clean` mode on the centre-cropped square image (no resize before the 299 px one).
- `adm`: the ADM evaluator (openai/guided-diffusion evaluations/, LlamaGen's class-to-image numbers):
  images enter as uint8 at the evaluation resolution, references brought there by ADM's `center_crop_arr`
  (halving with PIL BOX while the short side is at least twice the target, then bicubic and a centre crop);
  the Inception resizes to 299 itself, bilinear the TensorFlow-1 way (torch-fidelity's port does the same).

clean-fid feeds its float32 resize to the network; the torch-fidelity Inception takes uint8, so the 299 px
image is rounded to the nearest grey level first (at most half a level per pixel).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from PIL import Image

FID_PROTOCOLS = {
    "llamagen": "centre-cropped square, LANCZOS to the resolution, clean-fid bicubic float32 to 299",
    "clean": "centre-cropped square, clean-fid bicubic float32 to 299",
    "adm": "ADM center_crop_arr to the resolution, the Inception's own bilinear resize",
}
DEFAULT_FID_PROTOCOL = "llamagen"
CLEAN_SIZE = 299  # the Inception's input size, which clean-fid resizes to itself


def check_protocol(protocol: str) -> str:
    if protocol not in FID_PROTOCOLS:
        raise ValueError(f"fid.protocol={protocol!r} is not one of {sorted(FID_PROTOCOLS)}")
    return protocol


def describe(protocol: str, resolution: int | None) -> str:
    """The protocol with its resolution, as FID outputs name it (and the reference cache is keyed by)."""
    at = "the images' own size" if resolution is None else f"{resolution} px"
    return f"{check_protocol(protocol)} ({FID_PROTOCOLS[protocol]}; resolution {at})"


def protocol_image(path: str | Path, protocol: str, resolution: int | None = None) -> torch.Tensor:
    """uint8 [3, H, W]: the image at `path` as the FID extractor receives it under `protocol`; `resolution`
    None keeps the (cropped) image's own size."""
    check_protocol(protocol)
    with Image.open(path) as image:
        image = image.convert("RGB")
    if protocol == "adm":
        image = center_crop_arr(image, resolution or min(image.size))
    else:
        image = _centre_square(image)
        if protocol == "llamagen" and resolution is not None and image.size != (resolution, resolution):
            image = image.resize((resolution, resolution), Image.Resampling.LANCZOS)
        image = clean_resize(image)
    return torch.from_numpy(np.asarray(image).copy()).permute(2, 0, 1)


def protocol_batches(
    paths: list[Path], protocol: str, resolution: int | None, batch_size: int
) -> Iterator[torch.Tensor]:
    """uint8 [B, 3, H, W] batches of `protocol_image`, in order."""
    for start in range(0, len(paths), batch_size):
        chunk = paths[start : start + batch_size]
        yield torch.stack([protocol_image(path, protocol, resolution) for path in chunk])


def _centre_square(image: Image.Image) -> Image.Image:
    """GigaGAN's CenterCropLongEdge (torchvision center_crop to the short side), in PIL."""
    side = min(image.size)
    left = int(round((image.width - side) / 2.0))
    top = int(round((image.height - side) / 2.0))
    return image.crop((left, top, left + side, top + side))


def clean_resize(image: Image.Image, size: int = CLEAN_SIZE) -> Image.Image:
    """clean-fid's `clean` resize (cleanfid/resize.py, make_resizer("PIL", False, "bicubic")): each channel a
    float32 PIL image resized bicubic, clipped to [0, 255]; then rounded to uint8 (module docstring)."""
    array = np.asarray(image).astype(np.float32)
    channels = [
        np.asarray(Image.fromarray(array[:, :, c]).resize((size, size), Image.Resampling.BICUBIC))
        for c in range(3)
    ]
    resized = np.clip(np.stack(channels, axis=2), 0, 255)
    return Image.fromarray(np.rint(resized).astype(np.uint8))


def center_crop_arr(image: Image.Image, size: int) -> Image.Image:
    """ADM's centre crop (guided-diffusion image_datasets.py; LlamaGen's dataset/augmentation.py)."""
    while min(*image.size) >= 2 * size:
        image = image.resize(tuple(x // 2 for x in image.size), resample=Image.Resampling.BOX)
    scale = size / min(*image.size)
    image = image.resize(tuple(round(x * scale) for x in image.size), resample=Image.Resampling.BICUBIC)
    array = np.asarray(image)
    top, left = (array.shape[0] - size) // 2, (array.shape[1] - size) // 2
    return Image.fromarray(array[top : top + size, left : left + size])
