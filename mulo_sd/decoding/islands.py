"""Rejection islands (docs/algorithm.md sections 6-7): which positions MuLo-SD resamples, and in which groups.

Positions are raster indices into an h x w grid (p = row * w + col).
- `expand_rejections`: R_X = union over rejected t of N(t, l) = {u : |row_u - row_t| <= l,
  |col_u - col_t| <= l}, keeping only u >= t0 (the first rejection; nothing before it is touched) and only
  this cycle's draft positions. l = 0 gives R_X = R_T (the "naive local" ablation).
- `label_components`: 8-connected components of a boolean grid (scipy.ndimage.label with a 3x3 structure of
  ones), labelled 1..n in the raster order of each component's first position.
- `find_islands`: the components of R_X as lists of rows of positions, the shape the island filler uses.
"""

from __future__ import annotations

import numpy as np
import scipy.ndimage
import torch
import torch.nn.functional as F

EIGHT_NEIGHBOURS = np.ones((3, 3), dtype=bool)


def expand_rejections(rejected: torch.Tensor, l: int, draft: torch.Tensor) -> torch.Tensor:
    """rejected, draft: bool [h, w] (rejected must lie inside draft) -> R_X, bool [h, w]."""
    if l < 0:
        raise ValueError(f"l must be >= 0 (0 = naive local rejection), got {l}")
    if rejected.shape != draft.shape or rejected.dim() != 2:
        raise ValueError(
            f"rejected and draft must be [h, w] masks of one shape, got {rejected.shape}, {draft.shape}"
        )
    if (rejected & ~draft).any():
        raise ValueError("rejected positions must be draft positions")
    if not rejected.any():
        return torch.zeros_like(rejected)
    grown = F.max_pool2d(rejected[None, None].float(), 2 * l + 1, stride=1, padding=l)[0, 0] > 0
    first = int(rejected.flatten().nonzero()[0])
    after_first = torch.arange(rejected.numel(), device=rejected.device).view(rejected.shape) >= first
    return grown & after_first & draft


def label_components(mask: torch.Tensor) -> tuple[torch.Tensor, int]:
    """mask bool [h, w] -> (labels int64 [h, w]: 0 off the mask, 1..n on it; n). 8-connectivity.

    scipy numbers the components in the raster order of their first positions, the order find_islands and
    the statistics (island_sizes) rely on; tests/decoding/test_islands.py checks it against a flood fill."""
    if mask.dim() != 2:
        raise ValueError(f"mask must be a 2-D [h, w] grid, got shape {list(mask.shape)}")
    labels, count = scipy.ndimage.label(mask.bool().cpu().numpy(), structure=EIGHT_NEIGHBOURS)
    return torch.from_numpy(labels).long().to(mask.device), int(count)


def find_islands(mask: torch.Tensor) -> list[list[list[int]]]:
    """mask bool [h, w] -> islands in the order of their first position; each island is its rows top to
    bottom, each row the island's raster positions in that row, left to right."""
    labels, count = label_components(mask)
    width = mask.shape[1]
    islands: list[dict[int, list[int]]] = [{} for _ in range(count)]
    for position, label in enumerate(labels.flatten().tolist()):
        if label:
            islands[label - 1].setdefault(position // width, []).append(position)
    return [[rows[row] for row in sorted(rows)] for rows in islands]
