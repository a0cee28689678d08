"""LPIPS perceptual distance (the `lpips` package), frozen, with its backbone loaded offline.

The linear layers' weights ship inside the `lpips` package. The backbone (ImageNet-trained torchvision
vgg16 / alexnet / squeezenet1_1) is read from the local torch hub cache, where torchvision itself would
put it; nothing downloads. `pretrained_backbone=False` uses a random backbone (testbed and tests), in
which case the values are not perceptual: a warning says so where a loss uses it (`as_loss`); as a
validation metric only, its description (`describe()`, logged as `lpips_metric`) does.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import lpips
import torch
import torch.nn as nn
from mulo_sd.training.frozen import frozen
from torchvision.models import AlexNet_Weights, SqueezeNet1_1_Weights, VGG16_Weights

# torchvision's ImageNet weights for each LPIPS backbone; the cache file name is the URL's last part
BACKBONE_WEIGHTS = {
    "vgg": VGG16_Weights.IMAGENET1K_V1,
    "alex": AlexNet_Weights.IMAGENET1K_V1,
    "squeeze": SqueezeNet1_1_Weights.IMAGENET1K_V1,
}


def backbone_weights_path(net: str) -> Path:
    """Where the ImageNet weights of LPIPS backbone `net` are expected: torch hub's checkpoint folder."""
    return Path(torch.hub.get_dir()) / "checkpoints" / BACKBONE_WEIGHTS[net].url.rsplit("/", 1)[-1]


class LPIPS(nn.Module):
    """Frozen LPIPS distance between image batches in [-1, 1]. Stays in eval mode whatever its parent does,
    and keeps its weights out of the parent's state_dict (they come from the package and the torch cache,
    not from training). `as_loss`: a training loss uses it (a random backbone warns only then)."""

    def __init__(
        self, net: str = "vgg", pretrained_backbone: bool = True, linear_weights: bool = True,
        as_loss: bool = True,
    ):  # fmt: skip
        super().__init__()
        if net not in BACKBONE_WEIGHTS:
            raise ValueError(f"unknown LPIPS backbone {net!r}, expected one of {tuple(BACKBONE_WEIGHTS)}")
        self.net = net
        self.linear_weights = linear_weights
        weights_path = backbone_weights_path(net)
        if pretrained_backbone and not weights_path.is_file():
            raise FileNotFoundError(
                f"LPIPS backbone weights {weights_path.name} not found in {weights_path.parent}: "
                f"put torchvision's {BACKBONE_WEIGHTS[net].url} there (nothing downloads at run time), "
                f"or set pretrained_backbone: false for a random, non-perceptual backbone"
            )
        # A fixed seed makes the random parts (backbone, or linear layers) the same in every run.
        with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
            torch.manual_seed(0)
            warnings.filterwarnings("ignore", category=UserWarning, module="torchvision")
            self.model = lpips.LPIPS(net=net, pretrained=linear_weights, pnet_rand=True, verbose=False)
        if pretrained_backbone:
            self._load_backbone(weights_path)
            self.backbone = f"{weights_path.name} (ImageNet, from {weights_path.parent})"
        else:
            self.backbone = "random (NOT perceptual)"
            if as_loss:  # a validation metric only: `describe()` says so where it is logged
                warnings.warn(
                    f"LPIPS uses a RANDOM {net} backbone (pretrained_backbone=False): its values are not "
                    "perceptual distances and must not be reported as LPIPS",
                    UserWarning,
                    stacklevel=2,
                )
        frozen(self)

    def _load_backbone(self, path: Path) -> None:
        # lpips splits torchvision's `features` into slices but keeps the layer indices:
        # alexnet's `features.3.weight` is lpips `slice2.3.weight`.
        saved = torch.load(path, map_location="cpu", weights_only=True)
        backbone = self.model.net
        state = {}
        for name in backbone.state_dict():
            key = "features." + name.split(".", 1)[1]
            if key not in saved:
                raise ValueError(f"{path} lacks {key}: is it torchvision's {BACKBONE_WEIGHTS[self.net].url}?")
            state[name] = saved[key]
        backbone.load_state_dict(state)

    def describe(self) -> str:
        linear = "lpips v0.1 linear layers" if self.linear_weights else "RANDOM linear layers"
        return f"LPIPS({self.net}; backbone: {self.backbone}; {linear})"

    def forward(
        self, prediction: torch.Tensor, target: torch.Tensor, reduction: str = "mean"
    ) -> torch.Tensor:
        """Distance between [B,3,H,W] batches in [-1, 1]: a scalar (`"mean"`) or shape [B] (`"per_sample"`).
        Gradients flow to the inputs, not to the frozen weights."""
        if prediction.shape != target.shape:
            raise ValueError(
                f"LPIPS needs images of the same shape, got {tuple(prediction.shape)} "
                f"and {tuple(target.shape)}"
            )
        distance = self.model(prediction, target).flatten()
        if reduction == "mean":
            return distance.mean()
        if reduction == "per_sample":
            return distance
        raise ValueError(f"unknown reduction {reduction!r}, expected 'mean' or 'per_sample'")
