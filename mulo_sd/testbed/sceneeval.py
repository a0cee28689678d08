"""SceneEval: the testbed's GenEval and Inception. A small CNN reads SynthScenes images back into the
attributes their captions state, and its pooled features give a Frechet distance (FD, the FID analogue).

    model = SceneEval.from_pretrained("mulo_sd/assets/testbed/sceneeval")
    per_prompt = score(model, images, captions)          # [B] fraction of each caption's checks passed
    fd = frechet_distance(scene_features(model, real), scene_features(model, generated))

What the model reads (only from pixels), for each of the 56 (colour, shape) pairs: a density map over the
feature grid, trained towards one unit-mass Gaussian blob per object at its centre (`density_targets`).
- count: the map's sum, rounded and clipped to 0..4;
- centroid: the map's mean position (x right, y down, in [0,1], as in the SynthScenes record).
Each cell's map is factorised as object mass x P(colour) x P(shape), so colour and shape are each learnt
from every object rather than from the few objects of one pair. (In CPU probes, a per-pair count classifier
on pooled features and an unfactorised per-pair density both still read "no objects" after 150+ steps; this
head read objects in held-out scenes at 85% after 400 steps.)
Any square image size works: the input is resized to `config.image_size` first (area averaging down,
bilinear up). The globally pooled last feature map is the FD feature space.

A caption is turned into checks by `parse_caption`; per group phrase ("two red circles", "a blue star"):
- object:   the pair (colour, shape) is present, i.e. its read count is >= 1;
- count:    its read count equals the stated count ("a"/"an" state one: a SynthScenes group holds every
            object of its colour and shape);
- colour:   some object of that colour is present (read counts of that colour, over all shapes, sum to >= 1);
and for "X <relation> Y" (always the first two groups):
- relation: both pairs are present and their read centroids satisfy the relation with the caption rule's
            margins relaxed (see `relation_holds`), so that small centroid errors do not fail true images.
As in GenEval, an image's score for its prompt is passed / total checks, and a method's accuracy is the mean
over prompts; per check kind, the fraction of checks passed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import scipy.linalg
import torch
import torch.nn as nn
import torch.nn.functional as F

from mulo_sd.nets.io import Pretrained
from mulo_sd.testbed.captions import caption_words
from mulo_sd.testbed.synthscenes import (
    BACKGROUNDS,
    COLOURS,
    COUNT_WORDS,
    MAX_OBJECTS,
    PLURALS,
    RELATION_MIN_OFFSET,
    RELATIONS,
    SHAPES,
)

# Pair index = colour index * len(SHAPES) + shape index, the order SynthScenes samples kinds in.
PAIRS: list[tuple[str, str]] = [(colour, shape) for colour in COLOURS for shape in SHAPES]
PAIR_INDEX = {pair: i for i, pair in enumerate(PAIRS)}
# Width of an object's density blob, in feature-grid cells: narrow, so neighbouring objects stay apart.
DENSITY_SIGMA = 0.5
CHECK_KINDS = ("object", "count", "colour", "relation")
# A relation check passes when the subject is offset in the stated direction by at least this fraction of
# the image side and no less than across that direction: half the caption's margin and ratio 1 instead of
# RELATION_MIN_RATIO, so a true scene passes despite small centroid errors (GenEval is similarly lenient).
RELATION_CHECK_OFFSET = RELATION_MIN_OFFSET / 2


@dataclass
class SceneEvalConfig:
    image_size: int = 128  # inputs of any other size are resized to this
    patch: int = 4  # the stem is a patch x patch, stride-patch conv: cheap, and it sees every pixel
    # width after the stem, then after each further stride-2 stage; the last one is the FD feature size
    channels: list[int] = field(default_factory=lambda: [48, 96, 192])

    def __post_init__(self):
        self.channels = [int(c) for c in self.channels]
        if not self.channels or min(self.channels) < 1 or self.patch < 1:
            raise ValueError(f"need patch >= 1 and positive channels, got {self.patch}, {self.channels}")
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


def cell_centres(grid: int) -> torch.Tensor:
    """(x, y) of the centres of a grid x grid raster over [0,1]^2, row-major: [grid*grid, 2]."""
    centres = (torch.arange(grid, dtype=torch.float32) + 0.5) / grid
    return torch.stack(torch.meshgrid(centres, centres, indexing="xy"), -1).view(grid * grid, 2)


def scene_targets(attributes: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Truth of one SynthScenes attribute record: counts int64 [P], centroids [P,2], present bool [P]."""
    counts = torch.zeros(len(PAIRS), dtype=torch.long)
    centroids = torch.zeros(len(PAIRS), 2)
    for group in attributes["groups"]:
        i = PAIR_INDEX[(group["colour"], group["shape"])]
        counts[i] = group["count"]
        centroids[i] = torch.tensor(group["centroid"], dtype=torch.float32)
    return counts, centroids, counts > 0


def batch_targets(attributes: list[dict], device: torch.device | str = "cpu"):
    """`scene_targets` of a batch of records, stacked: counts [B,P], centroids [B,P,2], present [B,P]."""
    targets = [scene_targets(record) for record in attributes]
    return tuple(torch.stack([t[k] for t in targets]).to(device) for k in range(3))


def density_targets(attributes: list[dict], grid: int) -> torch.Tensor:
    """Target density maps [B,P,grid,grid]: per object, a Gaussian of DENSITY_SIGMA cells at its centre,
    normalised to sum 1 over the grid, so every map sums to its pair's count."""
    centres = (torch.arange(grid, dtype=torch.float32) + 0.5) / grid
    maps = torch.zeros(len(attributes), len(PAIRS), grid, grid)
    for b, record in enumerate(attributes):
        for obj in record["objects"]:
            gx = torch.exp(-0.5 * ((centres - obj["x"]) * grid / DENSITY_SIGMA) ** 2)
            gy = torch.exp(-0.5 * ((centres - obj["y"]) * grid / DENSITY_SIGMA) ** 2)
            blob = gy[:, None] * gx[None, :]
            maps[b, PAIR_INDEX[(obj["colour"], obj["shape"])]] += blob / blob.sum()
    return maps


# ---- captions -> checks --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Check:
    """One attribute check of a caption (kinds and pass rules in the module docstring)."""

    kind: str  # one of CHECK_KINDS
    colour: str
    shape: str | None = None  # None for a colour check
    count: int | None = None  # count checks only
    relation: str | None = None  # relation checks: (colour, shape) `relation` other
    other: tuple[str, str] | None = None


_QUANTITIES = {"a": 1, "an": 1, **{word: n for n, word in COUNT_WORDS.items()}}
_SHAPE_WORDS = {shape: (shape, False) for shape in SHAPES} | {p: (s, True) for s, p in PLURALS.items()}
_RELATION_WORDS = {tuple(relation.split()): relation for relation in RELATIONS}


def _parse_group(words: list[str], i: int, text: str) -> tuple[tuple[int, str, str], int]:
    """(count, colour, shape) of the group phrase starting at word i, and the index after it."""
    if i + 3 > len(words):
        raise ValueError(
            f"caption ends inside a group phrase (expected '<a|two..> <colour> <shape>'): {text!r}"
        )
    quantity, colour, shape_word = words[i : i + 3]
    if quantity not in _QUANTITIES:
        raise ValueError(f"expected 'a', 'an' or a count word at word {i} ({quantity!r}) of {text!r}")
    if colour not in COLOURS:
        raise ValueError(f"unknown colour {colour!r} (known: {', '.join(COLOURS)}) in {text!r}")
    if shape_word not in _SHAPE_WORDS:
        raise ValueError(f"unknown shape {shape_word!r} (known: {', '.join(SHAPES)}) in {text!r}")
    shape, plural = _SHAPE_WORDS[shape_word]
    count = _QUANTITIES[quantity]
    if plural != (count > 1):
        raise ValueError(f"{quantity!r} does not agree with {shape_word!r} in {text!r}")
    return (count, colour, shape), i + 3


def parse_caption(text: str) -> list[Check]:
    """The checks a SynthScenes caption states: object, count and colour per group, in caption order, then
    the relation between the first two groups if there is one. The background is not checked.

    Grammar (punctuation ignored): GROUP [RELATION GROUP] {[and] GROUP} on a BACKGROUND background, with
    GROUP = (a|an) COLOUR SHAPE | (two|three|four) COLOUR SHAPES.
    """
    words = caption_words(text)
    if len(words) < 4 or words[-4:-2] != ["on", "a"] or words[-1] != "background":
        raise ValueError(f"a SynthScenes caption ends with 'on a <kind> background': {text!r}")
    if words[-2] not in BACKGROUNDS:
        raise ValueError(f"unknown background {words[-2]!r} (known: {', '.join(BACKGROUNDS)}) in {text!r}")
    body = words[:-4]
    group, i = _parse_group(body, 0, text)
    groups, relation = [group], None
    while i < len(body):
        matched = next((r for r in _RELATION_WORDS if tuple(body[i : i + len(r)]) == r), None)
        if matched is not None:
            if len(groups) != 1:
                raise ValueError(f"a relation may only join the first two groups: {text!r}")
            relation, i = _RELATION_WORDS[matched], i + len(matched)
        elif body[i] == "and":
            i += 1
        group, i = _parse_group(body, i, text)
        groups.append(group)
    checks = []
    for count, colour, shape in groups:
        checks += [
            Check("object", colour, shape),
            Check("count", colour, shape, count=count),
            Check("colour", colour),
        ]
    if relation is not None:
        (_, colour, shape), (_, other_colour, other_shape) = groups[:2]
        checks.append(Check("relation", colour, shape, relation=relation, other=(other_colour, other_shape)))
    return checks


# ---- scoring --------------------------------------------------------------------------------------------


def relation_holds(subject: torch.Tensor, other: torch.Tensor, relation: str) -> bool:
    """Whether centroid `subject` (x, y) lies `relation` of centroid `other` (image y points down): the offset
    in the stated direction is >= RELATION_CHECK_OFFSET and >= the absolute offset across it."""
    dx, dy = (float(v) for v in subject - other)
    along, across = {"left of": (-dx, dy), "right of": (dx, dy), "above": (-dy, dx), "below": (dy, dx)}[
        relation
    ]
    return along >= RELATION_CHECK_OFFSET and along >= abs(across)


def check_passed(check: Check, counts: torch.Tensor, centroids: torch.Tensor) -> bool:
    """Whether one image's read counts [P] and centroids [P,2] pass `check`."""
    if check.kind == "colour":
        start = list(COLOURS).index(check.colour) * len(SHAPES)
        return int(counts[start : start + len(SHAPES)].sum()) >= 1
    i = PAIR_INDEX[(check.colour, check.shape)]
    if check.kind == "object":
        return int(counts[i]) >= 1
    if check.kind == "count":
        return int(counts[i]) == check.count
    if check.kind == "relation":
        j = PAIR_INDEX[check.other]
        present = int(counts[i]) >= 1 and int(counts[j]) >= 1
        return present and relation_holds(centroids[i], centroids[j], check.relation)
    raise ValueError(f"unknown check kind {check.kind!r} (known: {', '.join(CHECK_KINDS)})")


def check_results(
    counts: torch.Tensor, centroids: torch.Tensor, captions: list[str]
) -> list[list[tuple[Check, bool]]]:
    """Each check of caption i and whether image i passes it, from read counts [B,P], centroids [B,P,2]."""
    if len(captions) != counts.shape[0]:
        raise ValueError(f"{counts.shape[0]} images but {len(captions)} captions")
    counts, centroids = counts.cpu(), centroids.float().cpu()
    return [
        [(check, check_passed(check, counts[b], centroids[b])) for check in parse_caption(caption)]
        for b, caption in enumerate(captions)
    ]


def prompt_scores(results: list[list[tuple[Check, bool]]]) -> torch.Tensor:
    """Per-prompt score [B] of `check_results`: passed / total checks."""
    return torch.tensor([sum(passed for _, passed in checks) / len(checks) for checks in results])


def kind_scores(results: list[list[tuple[Check, bool]]]) -> list[dict[str, float]]:
    """Per prompt of `check_results`: for each kind of check it states, the fraction of those passed."""
    scores = []
    for checks in results:
        kinds = {kind: [passed for check, passed in checks if check.kind == kind] for kind in CHECK_KINDS}
        scores.append({kind: sum(passed) / len(passed) for kind, passed in kinds.items() if passed})
    return scores


def score(model, images: torch.Tensor, captions: list[str]) -> torch.Tensor:
    """Per-image GenEval-style score [B]: the fraction of its caption's checks the image passes. `model` is
    anything with `predict(images) -> (counts [B,P], centroids [B,P,2])`, normally a SceneEval in eval mode
    (as `from_pretrained` returns it)."""
    if len(captions) != images.shape[0]:
        raise ValueError(f"{images.shape[0]} images but {len(captions)} captions")
    counts, centroids = model.predict(images)
    return prompt_scores(check_results(counts, centroids, captions))


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
