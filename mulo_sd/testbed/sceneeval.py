"""SceneEval: the testbed's GenEval and Inception. A small CNN reads SynthScenes images back into the
attributes their captions state, and its pooled features give a Frechet distance (FD, the FID analogue).

    model = SceneEval.from_pretrained("mulo_sd/assets/testbed/sceneeval")
    per_prompt = score(model, images, captions)          # [B] fraction of each caption's checks passed
    kinds = model.predict_background(images)             # [B] background kind, index into BACKGROUNDS
    fd = frechet_distance(scene_features(model, real), scene_features(model, generated))

The model reads, for each of the 56 (colour, shape) pairs, a density map over the feature grid whose sum is
the pair's count and whose mean position its centroid (the targets: mulo_sd/testbed/scene_truth.py). Each
cell's map is factorised as object mass x P(colour) x P(shape), so colour and shape are each learnt
from every object rather than from the few objects of one pair. (In CPU probes, a per-pair count classifier
on pooled features and an unfactorised per-pair density both still read "no objects" after 150+ steps; this
head read objects in held-out scenes at 85% after 400 steps.)
The background head (`config.background_channels` > 0) classifies the background kind from the stem's
high-resolution map: textures are lost by the last stage (a linear probe of the pooled last features reads
the kind at ~60%, two stride-2 convs over the stem's map with mean and standard-deviation pooling at 97%).
It was trained after the trunk, with the trunk frozen, so it changes no density map and no FD feature; it
reads held-out scenes at 98.4% and their VQ round trips at 91.1% (docs/testbed.md).
Any square image size works: the input is resized to `config.image_size` first (area averaging down,
bilinear up). The globally pooled last feature map is the FD feature space.

The caption checks and scores live in mulo_sd/testbed/scene_checks.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import scipy.linalg
import torch
import torch.nn as nn
import torch.nn.functional as F

from mulo_sd.nets.io import Pretrained
from mulo_sd.testbed.synthscenes import BACKGROUNDS, COLOURS, MAX_OBJECTS, SHAPES

# Layers of `SceneEval.backbone` that make the stem (patch conv, norm, ReLU, residual block): the background
# head reads their output, the feature map at image_size / patch.
STEM_LAYERS = 4


@dataclass
class SceneEvalConfig:
    image_size: int = 128  # inputs of any other size are resized to this
    patch: int = 4  # the stem is a patch x patch, stride-patch conv: cheap, and it sees every pixel
    # width after the stem, then after each further stride-2 stage; the last one is the FD feature size
    channels: list[int] = field(default_factory=lambda: [48, 96, 192])
    # width of the background head over the stem's map; 0: no head (as in files saved before it existed)
    background_channels: int = 0

    def __post_init__(self):
        self.channels = [int(c) for c in self.channels]
        if not self.channels or min(self.channels) < 1 or self.patch < 1:
            raise ValueError(f"need patch >= 1 and positive channels, got {self.patch}, {self.channels}")
        if self.background_channels < 0:
            raise ValueError(f"background_channels must be >= 0 (0: no head), got {self.background_channels}")
        if self.image_size % self.stride:
            raise ValueError(
                f"image_size={self.image_size} must be divisible by the total stride {self.stride} "
                f"(patch={self.patch} times 2 per further width in {self.channels})"
            )

    @property
    def stride(self) -> int:
        return self.patch * 2 ** (len(self.channels) - 1)


class Block(nn.Module):
    """Residual 3x3 conv."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, 1, 1, bias=False)
        self.norm = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(x + self.norm(self.conv(x)))


def conv_bn_relu(in_ch: int, out_ch: int, kernel: int, stride: int, padding: int) -> list[nn.Module]:
    return [
        nn.Conv2d(in_ch, out_ch, kernel, stride, padding, bias=False),
        nn.BatchNorm2d(out_ch),
        nn.ReLU(inplace=True),
    ]


class BackgroundHead(nn.Module):
    """Background kind logits [B, len(BACKGROUNDS)] from the stem's map: two stride-2 conv stages, then each
    channel's mean and standard deviation over the map (a texture shows in how a response varies)."""

    def __init__(self, in_ch: int, width: int):
        super().__init__()
        self.convs = nn.Sequential(*conv_bn_relu(in_ch, width, 3, 2, 1), *conv_bn_relu(width, width, 3, 2, 1))
        self.classify = nn.Linear(2 * width, len(BACKGROUNDS))

    def forward(self, stem: torch.Tensor) -> torch.Tensor:
        x = self.convs(stem)
        return self.classify(torch.cat([x.mean((2, 3)), x.std((2, 3), correction=0)], 1))


class SceneEval(nn.Module, Pretrained):
    kind = "sceneeval"
    config_class = SceneEvalConfig

    def __init__(self, config: SceneEvalConfig):
        super().__init__()
        self.config = config
        widths = config.channels
        layers = [*conv_bn_relu(3, widths[0], config.patch, config.patch, 0), Block(widths[0])]
        for a, b in zip(widths[:-1], widths[1:], strict=True):
            layers += [*conv_bn_relu(a, b, 3, 2, 1), Block(b)]
        self.backbone = nn.Sequential(*layers)
        # per cell: object mass logit, colour logits, shape logits
        self.head = nn.Conv2d(widths[-1], 1 + len(COLOURS) + len(SHAPES), 1)
        nn.init.constant_(self.head.bias[:1], -4.0)  # start near zero mass: most cells hold no object
        if config.background_channels:
            self.background_head = BackgroundHead(widths[0], config.background_channels)

    @property
    def feature_dim(self) -> int:
        return self.config.channels[-1]

    @property
    def grid(self) -> int:
        """Side of the feature grid (and of the density maps)."""
        return self.config.image_size // self.config.stride

    def resize(self, images: torch.Tensor) -> torch.Tensor:
        if images.ndim != 4 or images.shape[1] != 3 or images.shape[2] != images.shape[3]:
            raise ValueError(f"expected square images [B,3,S,S] in [-1,1], got shape {tuple(images.shape)}")
        size = self.config.image_size
        if images.shape[-1] == size:
            return images
        mode = "area" if images.shape[-1] > size else "bilinear"  # area = box filter, as the data's BOX
        return F.interpolate(images, size=(size, size), mode=mode)

    def feature_map(self, images: torch.Tensor) -> torch.Tensor:
        return self.backbone(self.resize(images))

    def features(self, images: torch.Tensor) -> torch.Tensor:
        """Globally pooled penultimate features [B, feature_dim]: the FD feature space."""
        return self.feature_map(images).mean((2, 3))

    def forward(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
        """density [B,P,g,g], counts [B,P] (the density's sums), centroids [B,P,2], features [B,F]; P = 56."""
        fmap = self.feature_map(images)
        logits = self.head(fmap)
        mass = F.softplus(logits[:, :1])  # [B,1,g,g]
        colour = logits[:, 1 : 1 + len(COLOURS)].softmax(1)  # [B,C,g,g]
        shape = logits[:, 1 + len(COLOURS) :].softmax(1)  # [B,S,g,g]
        density = (mass[:, :, None] * colour[:, :, None] * shape[:, None]).flatten(1, 2)  # pair = c*S + s
        counts = density.sum((2, 3))
        weights = density.flatten(2) / counts[..., None].clamp_min(1e-8)
        return {
            "density": density,
            "counts": counts,
            "centroids": weights @ cell_centres(self.grid).to(weights),
            "features": fmap.mean((2, 3)),
        }

    @torch.no_grad()
    def predict(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Read counts (int64 [B,P], 0..MAX_OBJECTS) and centroids ([B,P,2]) of every (colour, shape) pair."""
        out = self(images)
        return out["counts"].round().clamp(0, MAX_OBJECTS).long(), out["centroids"]

    def trunk_state_dict(self) -> dict[str, torch.Tensor]:
        """The state dict without the background head: every tensor that the scores and FD features read."""
        return {k: v for k, v in self.state_dict().items() if not k.startswith("background_head.")}

    def background_logits(self, images: torch.Tensor) -> torch.Tensor:
        """Background kind logits [B, len(BACKGROUNDS)] (needs the head: `config.background_channels` > 0)."""
        if not self.config.background_channels:
            raise ValueError(
                "this SceneEval has no background head (config.background_channels = 0, e.g. a file saved "
                "before the head existed); train one: mulo-train experiment=testbed/sceneeval_background"
            )
        return self.background_head(self.backbone[:STEM_LAYERS](self.resize(images)))

    @torch.no_grad()
    def predict_background(self, images: torch.Tensor) -> torch.Tensor:
        """Read background kinds: int64 [B], indices into synthscenes.BACKGROUNDS."""
        return self.background_logits(images).argmax(1)


def cell_centres(grid: int) -> torch.Tensor:
    """(x, y) of the centres of a grid x grid raster over [0,1]^2, row-major: [grid*grid, 2]."""
    centres = (torch.arange(grid, dtype=torch.float32) + 0.5) / grid
    return torch.stack(torch.meshgrid(centres, centres, indexing="xy"), -1).view(grid * grid, 2)


# ---- Frechet distance ------------------------------------------------------------------------------------


@torch.no_grad()
def scene_features(model: SceneEval, images: torch.Tensor, batch_size: int = 64) -> torch.Tensor:
    """FD features [N, feature_dim] (float32, CPU) of images [N,3,S,S] in [-1,1], in batches."""
    device = next(model.parameters()).device
    starts = range(0, images.shape[0], batch_size)
    return torch.cat([model.features(images[i : i + batch_size].to(device)).float().cpu() for i in starts])


def _psd_sqrt(matrix: np.ndarray) -> np.ndarray:
    """Square root of a symmetric positive semi-definite matrix (eigenvalues clipped at 0: round-off)."""
    values, vectors = scipy.linalg.eigh(matrix)
    return (vectors * np.sqrt(np.clip(values, 0.0, None))) @ vectors.T


def frechet_distance_from_moments(
    mean_a: np.ndarray, cov_a: np.ndarray, mean_b: np.ndarray, cov_b: np.ndarray
) -> float:
    """||mean_a - mean_b||^2 + tr(cov_a + cov_b - 2 (cov_a cov_b)^(1/2)).

    tr (cov_a cov_b)^(1/2) is computed as the sum of square roots of the eigenvalues of the symmetric PSD
    matrix cov_a^(1/2) cov_b cov_a^(1/2) (same spectrum as cov_a cov_b), which avoids the complex round-off
    of a general matrix square root of a singular product (few samples, many features)."""
    root_a = _psd_sqrt(cov_a)
    middle = root_a @ cov_b @ root_a
    trace_sqrt = np.sqrt(np.clip(scipy.linalg.eigvalsh((middle + middle.T) / 2), 0.0, None)).sum()
    distance = np.sum((mean_a - mean_b) ** 2) + np.trace(cov_a) + np.trace(cov_b) - 2.0 * trace_sqrt
    return max(float(distance), 0.0)  # identical sets can land a hair below zero by round-off


def frechet_distance(features_a, features_b) -> float:
    """Frechet distance between Gaussians fitted (float64) to two feature sets [N,F] (tensors or arrays)."""
    a, b = (np.asarray(torch.as_tensor(f).detach().cpu(), dtype=np.float64) for f in (features_a, features_b))
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1] or min(len(a), len(b)) < 2:
        raise ValueError(
            f"need two feature sets [N,F] with the same F and N >= 2, got {a.shape} and {b.shape}"
        )
    cov_a, cov_b = (np.atleast_2d(np.cov(f, rowvar=False)) for f in (a, b))
    return frechet_distance_from_moments(a.mean(0), cov_a, b.mean(0), cov_b)
