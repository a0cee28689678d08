"""The truth SceneEval is trained and checked against, per (colour, shape) pair, from SynthScenes attribute
records: counts, centroids and the density maps its head is trained towards.

What the model reads (only from pixels), for each of the 56 (colour, shape) pairs: a density map over the
feature grid, trained towards one unit-mass Gaussian blob per object at its centre (`density_targets`).
- count: the map's sum, rounded and clipped to 0..4;
- centroid: the map's mean position (x right, y down, in [0,1], as in the SynthScenes record).
"""

from __future__ import annotations

import torch

from mulo_sd.testbed.synthscenes import BACKGROUNDS, COLOURS, SHAPES

# Pair index = colour index * len(SHAPES) + shape index, the order SynthScenes samples kinds in.
PAIRS: list[tuple[str, str]] = [(colour, shape) for colour in COLOURS for shape in SHAPES]
PAIR_INDEX = {pair: i for i, pair in enumerate(PAIRS)}
# Width of an object's density blob, in feature-grid cells: narrow, so neighbouring objects stay apart.
DENSITY_SIGMA = 0.5


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


def background_targets(attributes: list[dict], device: torch.device | str = "cpu") -> torch.Tensor:
    """Background kind of each record as an index into BACKGROUNDS: int64 [B]."""
    kinds = [BACKGROUNDS.index(record["background"]["kind"]) for record in attributes]
    return torch.tensor(kinds, dtype=torch.long, device=device)
