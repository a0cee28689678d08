"""Teacher forcing in the order a ZipAR-style filler samples a grid, so a drafter can be trained for the way
it is decoded (mulo_sd/decoding/methods/grid_fill.py `fill`, drafting from an empty grid).

At window w, row i starts once row i - 1 holds w tokens, so grid position (i, c) is drawn at step i * w + c
(raster order: w = width). Its query is the slot of (i, c - 1), written by the call after that token was
drawn, which sees only what earlier calls (and earlier positions of the same call) wrote. A row-start token
(i + 1, 0) is asked from the slot of (i, width - 1) before that token exists: the filler writes a stand-in
there (the newest known token before it, (i, w - 1)), which every later query sees until the true token is
written, in the call after it is drawn. So the cache holds two versions of each row-end slot over a decode;
the teacher-forced sequence here has both, and each version sees exactly what its call saw.

The result is exact: `GPT.forward_in_order` with this order gives the logits the filler samples from
(tests/decoding/test_fill_order.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class FillOrder:
    """The slot versions a fill writes, in feeding order. positions [n]: grid position of each version (its
    RoPE / causal index); inputs [n]: grid position whose token it holds; visible [n, n] bool: version a
    attends to version b; predictors [T - 1]: the version whose output is the distribution of grid position
    t + 1 (position 0 comes from the condition's last slot)."""

    positions: torch.Tensor
    inputs: torch.Tensor
    visible: torch.Tensor
    predictors: torch.Tensor

    def to(self, device: torch.device) -> FillOrder:
        tensors = (self.positions, self.inputs, self.visible, self.predictors)
        return FillOrder(*(tensor.to(device) for tensor in tensors))

    def attention_mask(self, cond_written: torch.Tensor) -> torch.Tensor:
        """Bool mask [B, 1, L + n, L + n] of the condition slots (cond_written [B, L]: False on padding) and
        the versions: the prefix is causal over its written slots, every version sees them all, and every
        slot sees itself (as slot_cache.visible_slots)."""
        batch, prefix = cond_written.shape
        size = prefix + self.positions.shape[0]
        causal = torch.ones(prefix, prefix, dtype=torch.bool, device=cond_written.device).tril()
        to_prefix = torch.cat([causal, causal.new_ones(size - prefix, prefix)])
        to_prefix = to_prefix[None] & cond_written[:, None, :]
        to_grid = torch.cat([causal.new_zeros(prefix, size - prefix), self.visible])
        mask = torch.cat([to_prefix, to_grid[None].expand(batch, -1, -1)], dim=2)
        return (mask | torch.eye(size, dtype=torch.bool, device=mask.device)).unsqueeze(1)


def fill_order(height: int, width: int, window: int | None) -> FillOrder:
    """The order of a fill of an empty height x width grid at `window` (None: raster order)."""
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise ValueError(f"window must be a positive integer or None (raster order), got {window!r}")
    w = width if window is None else min(window, width)
    size = height * width
    if size < 2:
        raise ValueError(f"a {height} x {width} grid has no token to teacher-force after the first")

    def drawn(p: int) -> int:
        return p // width * w + p % width

    # (position, input, written at call, replaced at call): the call after a token is drawn writes it
    versions = [(p, p, drawn(p) + 1, math.inf) for p in range(size - 1)]
    predictors = list(range(size - 1))
    if w < width:
        for i in range(height - 1):
            row_end = i * width + width - 1
            versions.append((row_end, i * width + w - 1, (i + 1) * w, drawn(row_end) + 1))
            predictors[row_end] = len(versions) - 1
    columns = zip(*versions, strict=True)
    position, inputs, written, replaced = (torch.tensor(column, dtype=torch.float64) for column in columns)
    visible = (
        (position[None, :] <= position[:, None])
        & (written[None, :] <= written[:, None])
        & (written[:, None] < replaced[None, :])
    )
    return FillOrder(position.long(), inputs.long(), visible, torch.tensor(predictors, dtype=torch.long))
