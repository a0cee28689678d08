"""A cache-free reference for the decoding methods: the exact distribution AR sampling draws a grid from.

Every conditional p(x_i | x_<i, cond) comes from a full teacher-forced forward of the prefix (`GPT.forward`,
no slot cache), guided (`guide`: the conditional rows against the rows whose caption is dropped) and
processed by `process_logits`, exactly as the decoding methods process the slot cache's logits
(docs/algorithm.md section 3). On a tiny grid the joint P(grid) = prod_i p(x_i | x_<i, cond) is enumerated
over all V ** (H * W) grids, the oracle of tests/decoding/test_exactness.py.
"""

from __future__ import annotations

import itertools

import torch

from mulo_sd.decoding.sampling import SamplerConfig, process_logits, sample
from mulo_sd.nets.guidance import guide


@torch.inference_mode()
def conditionals(model, grids: torch.Tensor, cond: torch.Tensor, sampler: SamplerConfig) -> torch.Tensor:
    """Processed distributions [B, T, V] of every position of grids [B, T] (raster order): entry t is what AR
    sampling draws token t from after the prefix grids[:, :t] (grids[:, t] itself is not read)."""
    cond = cond.expand(grids.shape[0], *cond.shape[1:])
    keep = torch.zeros(grids.shape[0], dtype=torch.bool, device=grids.device)
    logits = model(grids, cond, drop=keep)
    if sampler.cfg_scale != 1.0:
        logits = guide(logits, model(grids, cond, drop=~keep), sampler.cfg_scale)
    return process_logits(logits, sampler)


def all_grids(vocab: int, length: int) -> torch.Tensor:
    """Every grid [V ** length, length] in lexicographic order: row i is i written in base V."""
    return torch.tensor(list(itertools.product(range(vocab), repeat=length)), dtype=torch.long)


def grid_index(grids: torch.Tensor, vocab: int) -> torch.Tensor:
    """Row of `all_grids` holding each grid [..., length] -> int64 [...]."""
    length = grids.shape[-1]
    weights = vocab ** torch.arange(length - 1, -1, -1, device=grids.device)
    return (grids * weights).sum(-1)


def joint_distribution(model, cond: torch.Tensor, sampler: SamplerConfig) -> torch.Tensor:
    """P(grid) float64 [V ** (H * W)] for one condition cond [1, ...], indexed like `all_grids`."""
    height, width = model.grid_size
    grids = all_grids(model.vocab_size, height * width).to(model.device)
    probs = conditionals(model, grids, cond, sampler).double()
    return probs.gather(-1, grids[..., None])[..., 0].prod(-1).cpu()


@torch.inference_mode()
def reference_sample(
    model, cond: torch.Tensor, sampler: SamplerConfig, generator: torch.Generator
) -> torch.Tensor:
    """Sample grids [B, H, W] for cond [B, ...] in raster order, one full forward of the prefix per token. The
    draws are made like decode_ar's (one `sample` of [B, V] per position, same generator), so equal
    distributions give equal tokens."""
    height, width = model.grid_size
    tokens = torch.zeros(cond.shape[0], height * width, dtype=torch.long, device=cond.device)
    for i in range(height * width):
        probs = conditionals(model, tokens[:, : i + 1], cond, sampler)[:, i]
        tokens[:, i] = sample(probs, generator)
    return tokens.view(-1, height, width)
