"""Training-free pixel-space samplers (the paper's v2 default), with the learned samplers' call signatures.

PixelUpsampler: VQ-decode the low-res tokens -> enlarge the image r times (bicubic, bilinear, Lanczos, or a
super-resolution network from its weight file: mulo_sd/nets/sr_network.py) -> VQ-encode at the high
resolution. PixelDownsampler: decode -> area
(box) resize by 1/r -> encode.

Not row-causal: the VQ decoder and encoder have attention and deep convolution stacks, so every token can
depend on every row. `upsample_rows` therefore recomputes from the whole low-res prefix and returns only the
new rows; rows near the bottom of a prefix can come out differently once more rows exist below them.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from PIL import Image

from mulo_sd.nets.sr_network import SRNetwork
from mulo_sd.nets.upsampler import check_codebook_match

MODES = ("bicubic", "bilinear", "lanczos")


def load_sr_model(
    path: str | Path,
    r: int,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    trust_pickle: bool = False,
) -> nn.Module:
    """An x`r` super-resolution network, images [B, 3, H, W] in [-1, 1] -> [B, 3, r H, r W], from a local
    file: a published state dict (safetensors or a torch.save file read with weights_only=True; spandrel
    recognises its architecture: mulo_sd/nets/sr_network.py) or a folder holding one, a torch.export program
    (`.pt2`, torch.export.save), a TorchScript archive (torch.jit.save) or, with `trust_pickle`, a whole
    pickled module (torch.save(model)): unpickling a module runs code named in the file, so such a file is
    refused without it (mulo_sd/nets/safe_files.py). The last three map [-1, 1] themselves and are not
    resized: their output must be r times their input."""
    path = Path(path)
    if path.suffix == ".pt2" and path.is_file():
        return torch.export.load(str(path)).module().to(device)  # exported programs have no train/eval mode
    if path.is_file() and zipfile.is_zipfile(path):
        if any(n.endswith("/constants.pkl") for n in zipfile.ZipFile(path).namelist()):
            return torch.jit.load(str(path), map_location=device).eval()
    return SRNetwork(path, r, device=device, dtype=dtype, trust_pickle=trust_pickle)


def lanczos_resize(images: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """Lanczos resampling with PIL, one float32 channel at a time (no 8-bit rounding)."""
    arrays = images.detach().float().cpu().numpy()
    resized = [
        [
            np.asarray(Image.fromarray(channel).resize((width, height), Image.Resampling.LANCZOS))
            for channel in image
        ]
        for image in arrays
    ]
    return torch.from_numpy(np.array(resized)).to(device=images.device, dtype=images.dtype)


class _PixelPath:
    """What both pixel-space samplers share: the VQ they decode and re-encode through, and the scale r.
    A plain object, not an nn.Module: it has no weights of its own, works on the VQ's device, and exported
    programs refuse the train()/eval() calls a parent module would pass on to them."""

    role = "pixel sampler"

    def __init__(self, vq, r: int):
        if r < 2:
            raise ValueError(f"r must be >= 2 (the scale between the grids), got {r}")
        self.vq, self.r = vq, r

    @property
    def codebook_size(self) -> int:
        return self.vq.codebook_size

    @property
    def code_dim(self) -> int:
        return self.vq.code_dim

    def check_tokenizer(self, vq) -> None:
        check_codebook_match(self.role, self.vq.codebook, vq)


class PixelUpsampler(_PixelPath):
    """Up-sample tokens through pixels: `upsample(ids [B, h, w]) -> ids [B, r*h, r*w]`. With `sr_model_path`
    the file's network (load_sr_model: a published state dict, or an exported / scripted / pickled module)
    does the enlarging on the VQ's device in `dtype`, and `mode` is unused; a state-dict network of another
    scale than r is resized to r (`sr_model.resized_from`). trust_pickle: let a pickled module file load."""

    role = "pixel upsampler"

    def __init__(
        self,
        vq,
        r: int,
        mode: str = "bicubic",
        sr_model_path: str | Path | None = None,
        trust_pickle: bool = False,
        dtype: torch.dtype = torch.float32,
    ):
        super().__init__(vq, r)
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got '{mode}'")
        self.mode = mode
        device = vq.codebook.device
        self.sr_model = None
        if sr_model_path is not None:
            self.sr_model = load_sr_model(sr_model_path, r, device, dtype, trust_pickle)
        self.sr_model_path = sr_model_path

    def enlarge(self, images: torch.Tensor) -> torch.Tensor:
        """images [B, 3, H, W] -> [B, 3, r*H, r*W], clamped to [-1, 1] (bicubic and Lanczos overshoot)."""
        height, width = images.shape[-2] * self.r, images.shape[-1] * self.r
        if self.sr_model is not None:
            out = self.sr_model(images).to(images.dtype)
            if tuple(out.shape) != (images.shape[0], 3, height, width):
                raise ValueError(
                    f"super-resolution model {self.sr_model_path} turned {tuple(images.shape)} into "
                    f"{tuple(out.shape)}, expected {(images.shape[0], 3, height, width)} "
                    f"(an x{self.r} network)"
                )
        elif self.mode == "lanczos":
            out = lanczos_resize(images, height, width)
        else:
            out = F.interpolate(
                images, size=(height, width), mode=self.mode, align_corners=False, antialias=True
            )
        return out.clamp(-1.0, 1.0)

    @torch.no_grad()
    def upsample(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [B, h, w] -> ids [B, r*h, r*w]."""
        return self.vq.nearest_ids(self.latents(ids))

    @torch.no_grad()
    def latents(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [B, h, w] -> the VQ encoder's codes of the enlarged image before quantisation [B, D, r*h, r*w]
        (`upsample` is their nearest codebook entries)."""
        self.vq.check_ids(ids)
        return self.vq.continuous_codes(self.enlarge(self.vq.decode(ids)))

    @torch.no_grad()
    def upsample_rows(self, ids_low: torch.Tensor, first_row: int) -> torch.Tensor:
        """High-res rows r*first_row .. r*n - 1 for the low-res prefix ids_low [B, n, w], computed from the
        whole prefix (this sampler is not row-causal)."""
        self.vq.check_ids(ids_low)
        n = ids_low.shape[1]
        if not 0 <= first_row < n:
            raise ValueError(
                f"first_row must lie in [0, {n}) for a low-res prefix of {n} rows, got {first_row}"
            )
        return self.upsample(ids_low)[:, self.r * first_row :]


class PixelDownsampler(_PixelPath):
    """Down-sample tokens through pixels: `downsample(ids [B, H, W]) -> ids [B, H/r, W/r]`."""

    role = "pixel downsampler"

    @torch.no_grad()
    def downsample(self, ids_high: torch.Tensor) -> torch.Tensor:
        """ids_high [B, H, W] -> ids [B, H/r, W/r]."""
        self.vq.check_ids(ids_high)
        height, width = ids_high.shape[1:]
        if height % self.r or width % self.r:
            raise ValueError(
                f"high-res grid {height}x{width} is not divisible by the down-sampler's r={self.r}"
            )
        images = self.vq.decode(ids_high)
        small = F.interpolate(
            images, size=(images.shape[-2] // self.r, images.shape[-1] // self.r), mode="area"
        )
        return self.vq.encode(small)
