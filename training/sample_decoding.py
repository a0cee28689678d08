"""One webdataset sample -> the datamodule's decoded sample (datamodule.py): its caption, json attributes,
image (centre-cropped, plus area-downscaled copies) and token grids, checked; and batches of them.

Bad samples never stop training: an undecodable image, bad json, a token grid of the wrong shape or dtype, a
missing required member, an image whose header gives a size beyond `ImageLimits` (data/image_limits.py;
checked before any pixel is decoded, so a 1x20,000 px strip is never upscaled into gigabytes) or, when
`require_captions`, a missing or blank caption skips the sample with a rate-limited warning naming its key
and shard. Each worker counts the samples it skipped; every batch carries that worker's cumulative count as
`batch["skipped"]` and the worker's index as `batch["worker"]`; `skipped_total` sums the latest count of each
worker.

No Lightning or webdataset here: `mulo-data pretokenize` decodes with the same `SampleDecoder`.
"""

from __future__ import annotations

import io
import json
import warnings
from collections.abc import Iterable

import numpy as np
import torch
from mulo_sd.data.image_limits import ImageLimits
from PIL import Image

IMAGE_MEMBERS = ("png", "jpg", "jpeg", "webp")  # the first one present is the sample's image
WARN_FIRST = 10  # warn for each of the first skipped samples of a worker, then at powers of two


def worker_id() -> int:
    """Index of the DataLoader worker running this code (0 in the main process)."""
    info = torch.utils.data.get_worker_info()
    return 0 if info is None else info.id


def center_crop(image: Image.Image, size: int) -> Image.Image:
    """Shortest side to `size` (box-halving large images first, then bicubic), then the centre square."""
    while min(image.size) >= 2 * size:
        image = image.resize((image.width // 2, image.height // 2), Image.Resampling.BOX)
    scale = size / min(image.size)
    image = image.resize((round(image.width * scale), round(image.height * scale)), Image.Resampling.BICUBIC)
    left, top = (image.width - size) // 2, (image.height - size) // 2
    return image.crop((left, top, left + size, top + size))


def to_tensor(image: Image.Image) -> torch.Tensor:
    """RGB PIL image -> float tensor [3, H, W] in [-1, 1]."""
    return torch.from_numpy(np.array(image, dtype=np.float32)).permute(2, 0, 1) / 127.5 - 1.0


class SampleDecoder:
    """Raw tar sample -> decoded sample, or None (skipped, counted, warned) when the sample is unusable.

    Also the batch collation function, so that each batch reports the count of the worker that made it.
    """

    def __init__(
        self,
        image_size: int,
        extra_sizes: tuple[int, ...],
        token_shapes: dict[str, tuple[int, int]],
        load_images: bool,
        caption_key: str,
        caption_features: str | None = None,
        limits: ImageLimits | None = None,
        require_captions: bool = False,
    ):
        self.image_size = image_size
        self.extra_sizes = extra_sizes
        self.token_shapes = token_shapes
        self.load_images = load_images
        self.caption_key = caption_key
        self.caption_features = caption_features
        self.limits = limits or ImageLimits()
        self.require_captions = require_captions  # the datamodule sets it for the module it feeds
        self.skipped = 0  # each DataLoader worker counts in its own copy

    def __call__(self, sample: dict) -> dict | None:
        try:
            return self.decode(sample)
        except Exception as error:  # malformed bytes can raise almost anything from PIL, numpy or json
            self.skipped += 1
            if self.skipped <= WARN_FIRST or self.skipped & (self.skipped - 1) == 0:
                warnings.warn(
                    f"skipped sample {sample.get('__key__')!r} of {sample.get('__url__')}: "
                    f"{type(error).__name__}: {error} ({self.skipped} skipped by this worker so far; "
                    f"after {WARN_FIRST}, only every power of two is reported)",
                    stacklevel=1,
                )
            return None  # wds.map drops None results

    def decode(self, sample: dict) -> dict:
        caption = sample[self.caption_key].decode("utf-8").strip() if self.caption_key in sample else ""
        if self.require_captions and not caption:  # "" would train on the all-padding caption
            raise ValueError(
                f"no caption (member {self.caption_key!r} missing or blank), and this module trains on "
                "captions (data.require_captions=false keeps such samples)"
            )
        attributes = json.loads(sample["json"]) if "json" in sample else {}
        if not isinstance(attributes, dict):
            raise ValueError(f"json member is a {type(attributes).__name__}, expected an object")
        decoded = {"key": sample["__key__"], "caption": caption, "attributes": attributes}
        if self.load_images:
            member = next((name for name in IMAGE_MEMBERS if name in sample), None)
            if member is None:
                raise ValueError(f"missing image member (one of {', '.join(IMAGE_MEMBERS)})")
            with Image.open(io.BytesIO(sample[member])) as raw:  # reads the header only
                too_large = self.limits.problem(raw.size)
                if too_large is not None:
                    raise ValueError(f"{too_large} (data.max_pixels, data.max_aspect_ratio)")
                image = center_crop(raw.convert("RGB"), self.image_size)
            decoded["image"] = to_tensor(image)
            for px in self.extra_sizes:
                decoded[f"image_{px}"] = to_tensor(image.resize((px, px), Image.Resampling.BOX))
        for name, shape in self.token_shapes.items():
            member = f"{name}.npy"
            if member not in sample:
                raise ValueError(f"missing member {member!r}")
            grid = np.load(io.BytesIO(sample[member]), allow_pickle=False)
            if grid.shape != shape or not np.issubdtype(grid.dtype, np.integer):
                raise ValueError(f"{member} is {grid.dtype} {grid.shape}, expected integers of shape {shape}")
            decoded[name] = torch.from_numpy(grid.astype(np.int64))
        if self.caption_features is not None:
            member = f"{self.caption_features}.npy"
            if member not in sample:
                raise ValueError(
                    f"missing member {member!r} (caption features: mulo-data pretokenize --text-encoder)"
                )
            rows = np.load(io.BytesIO(sample[member]), allow_pickle=False)
            if rows.ndim != 2 or not np.issubdtype(rows.dtype, np.floating):
                raise ValueError(f"{member} is {rows.dtype} {rows.shape}, expected floats of shape [n, D]")
            decoded[self.caption_features] = torch.from_numpy(rows.astype(np.float32))
        return decoded

    def collate(self, samples: list[dict]) -> dict:
        """Stack tensors, keep the rest (and the caption features, one [n_i, D] tensor per caption) as lists;
        add this worker's skipped count and index."""
        batch = {}
        for name, value in samples[0].items():
            if name.startswith("__"):  # wds.map copies __key__ back into each result
                continue
            values = [sample[name] for sample in samples]
            stack = isinstance(value, torch.Tensor) and name != self.caption_features
            batch[name] = torch.stack(values) if stack else values
        batch["skipped"] = torch.tensor(self.skipped)
        batch["worker"] = torch.tensor(worker_id())
        return batch


def skipped_total(batches: Iterable[dict]) -> int:
    """Samples skipped by one rank's workers while producing `batches` (the latest count of each worker).

    Counts are cumulative per worker since its dataset was built: over the run for the training stream
    (its workers persist), per pass for the validation set when it uses workers. For the whole job, sum
    over ranks, e.g. `self.log(..., reduce_fx="sum", sync_dist=True)`.
    """
    latest: dict[int, int] = {}
    for batch in batches:
        worker = int(batch["worker"])
        latest[worker] = max(latest.get(worker, 0), int(batch["skipped"]))
    return sum(latest.values())


def sample_decoder(
    image_size: int,
    extra_sizes: Iterable[int],
    token_keys: Iterable[str],
    token_shapes: dict[str, Iterable[int]] | None,
    load_images: bool,
    caption_key: str,
    caption_features: str | None,
    limits: ImageLimits | None = None,
) -> SampleDecoder:
    """The datamodule's decoder, its settings checked: `extra_sizes` below image_size (downscaled images, so
    they need load_images), an [h, w] in `token_shapes` for each of `token_keys` ("tok16" or "tok16.npy"),
    and something to load. `limits`: the largest images decoded (default: ImageLimits())."""
    extra_sizes = tuple(int(px) for px in extra_sizes)
    bad_sizes = [px for px in extra_sizes if not 0 < px < image_size]
    if bad_sizes:
        raise ValueError(
            f"extra_sizes must lie strictly between 0 and image_size={image_size}, got {bad_sizes}"
        )
    if extra_sizes and not load_images:
        raise ValueError("extra_sizes are downscaled images: they need load_images=True")
    token_shapes = dict(token_shapes or {})
    shapes = {}
    for key in token_keys:
        name = key.removesuffix(".npy")
        if name not in token_shapes or len(token_shapes[name]) != 2:
            raise ValueError(
                f"token_shapes must give the [h, w] grid of token key {name!r}, got {token_shapes}"
            )
        shapes[name] = tuple(int(n) for n in token_shapes[name])
    if not load_images and not shapes:
        raise ValueError("nothing to load: set load_images=True or give token_keys")
    return SampleDecoder(
        image_size, extra_sizes, shapes, load_images, caption_key, caption_features or None, limits
    )


def captions_required(require_captions: bool | None, module: object | None) -> bool:
    """`data.require_captions`, or when it is null whether the LightningModule being trained declares
    `requires_captions` (the AR GPT and EAGLE modules do; VQ and sampler modules train without captions)."""
    if require_captions is not None:
        return bool(require_captions)
    return bool(getattr(module, "requires_captions", False))
