"""Super-resolution networks from their published weight files, for the pixel up-sampler
(mulo_sd/nets/pixel_samplers.py, docs/super_resolution.md).

A file holds a state dict (safetensors, or a torch.save `.pth` / `.pt` / `.bin` / `.ckpt` read with
weights_only=True: no code in it runs); spandrel recognises the architecture from the keys and shapes
(Real-ESRGAN's RRDBNet x2plus / x4plus and its compact SRVGGNetCompact, SwinIR, and the others spandrel
knows) and builds the network with the file's weights. A file of a whole pickled module loads only with
`trust_pickle` (unpickling it runs code the file names). Given a folder, its one weight file is read (the
testbed ships `model.safetensors` in mulo_sd/assets/testbed/sr_x2 and sr_x4).

`SRNetwork` maps images in [-1, 1] (the VQ's) to the r times larger image in [-1, 1]: spandrel's networks
take [0, 1]. When the network's own scale is not r, its output is resized to r times the input with
bicubic (antialiased when shrinking) and `resized_from` says from which scale, for the decode statistics.
"""

from __future__ import annotations

from pathlib import Path

import spandrel
import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import load_file

from mulo_sd.nets.safe_files import load_torch_file

SR_FILE_NAME = "model.safetensors"  # what a testbed SR folder holds (training/sr_module.py writes it)
WEIGHT_SUFFIXES = (".safetensors", ".pth", ".pt", ".bin", ".ckpt")
TRUST_OPT_IN = "trust_pickle=True (PixelUpsampler, load_sr_model)"


def sr_weight_file(path: str | Path) -> Path:
    """`path` itself, or the one weight file (WEIGHT_SUFFIXES) in the folder `path`."""
    path = Path(path)
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix in WEIGHT_SUFFIXES)
        if len(files) != 1:
            found = [p.name for p in files] or "none"
            raise FileNotFoundError(
                f"super-resolution folder {path}: expected one weight file ({'/'.join(WEIGHT_SUFFIXES)}), "
                f"found {found}"
            )
        return files[0]
    if not path.is_file():
        raise FileNotFoundError(
            f"super-resolution model {path} not found: give a state-dict file (.safetensors or .pth, e.g. "
            f"Real-ESRGAN's RealESRGAN_x2plus.pth) or a folder holding one"
        )
    return path


def read_sr_file(path: Path, trust_pickle: bool = False):
    """The file's state dict (or, with `trust_pickle`, whatever it pickles: a whole module)."""
    if path.suffix == ".safetensors":
        return load_file(path)
    return load_torch_file(path, opt_in=TRUST_OPT_IN, trust_pickle=trust_pickle)


def load_state_dict_network(path: Path, state: dict) -> spandrel.ImageModelDescriptor:
    """spandrel's network for the state dict `state` read from `path`; a clear error naming the file when
    spandrel does not know the architecture or it is not an image-to-image one."""
    try:
        descriptor = spandrel.ModelLoader().load_from_state_dict(spandrel.canonicalize_state_dict(state))
    except spandrel.UnsupportedModelError:
        keys = ", ".join(list(state)[:4])
        raise ValueError(
            f"{path}: spandrel does not recognise the architecture of this state dict (first keys: {keys}); "
            f"give the weights of an architecture it supports (Real-ESRGAN, its compact model, SwinIR, ...)"
        ) from None
    if not isinstance(descriptor, spandrel.ImageModelDescriptor) or descriptor.output_channels != 3:
        name = descriptor.architecture.name
        raise ValueError(f"{path}: a {name} network is not an RGB super-resolution one")
    return descriptor


def supported_dtype(descriptor: spandrel.ImageModelDescriptor, dtype: torch.dtype) -> torch.dtype:
    """`dtype`, or float32 for an architecture spandrel says does not run in it (some overflow in fp16)."""
    supported = {torch.bfloat16: descriptor.supports_bfloat16, torch.float16: descriptor.supports_half}
    return dtype if supported.get(dtype, True) else torch.float32


class SRNetwork(nn.Module):
    """`net(images [B, 3, H, W] in [-1, 1]) -> [B, 3, r H, r W]` from the weight file at `path` (module
    docstring), on `device` in `dtype` (float32 where spandrel says the architecture does not run in it; the
    input is cast to it, the output back to the input's dtype)."""

    def __init__(
        self,
        path: str | Path,
        r: int,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
        trust_pickle: bool = False,
    ):
        super().__init__()
        self.path = sr_weight_file(path)
        self.r, self.dtype = r, dtype
        state = read_sr_file(self.path, trust_pickle)
        if isinstance(state, nn.Module):  # a pickled whole module, trusted: it maps [-1, 1] itself
            self.network, self.scale, self.architecture, self.descriptor = state, None, "pickled module", None
        elif isinstance(state, dict):
            # spandrel's call pads an image below the architecture's size requirements and crops the output
            self.descriptor = load_state_dict_network(self.path, state)
            self.network, self.scale = self.descriptor.model, self.descriptor.scale
            self.dtype = supported_dtype(self.descriptor, dtype)
            self.architecture = self.descriptor.architecture.name
        else:
            raise ValueError(f"{self.path} holds a {type(state).__name__}, not a state dict or a network")
        self.network.to(device=device, dtype=self.dtype).eval().requires_grad_(False)

    @property
    def resized_from(self) -> int | None:
        """The network's own scale when its output is resized to r (None: it enlarges r times itself)."""
        return None if self.scale in (None, self.r) else self.scale

    @torch.no_grad()
    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = images.to(self.dtype)
        out = self.network(x) if self.descriptor is None else self.descriptor((x + 1) / 2) * 2 - 1
        size = (images.shape[-2] * self.r, images.shape[-1] * self.r)
        if tuple(out.shape[-2:]) != size and self.resized_from is not None:
            shrink = out.shape[-1] > size[1]
            out = F.interpolate(out.float(), size=size, mode="bicubic", align_corners=False, antialias=shrink)
        return out.to(images.dtype)

    def describe(self) -> str:
        scale = f"x{self.scale}" if self.scale else "its own scale"
        resized = f", resized x{self.scale} -> x{self.r} with bicubic" if self.resized_from else ""
        return f"{self.architecture} {scale} from {self.path}{resized}"
