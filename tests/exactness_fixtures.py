"""Tiny models and the chi-square goodness-of-fit check of tests/decoding/test_exactness.py.

The target is a random 1-block GPT over a 2 x 2 grid of vocabulary 3 (81 grids), its output head scaled so
that, under guidance, the joint distribution is far from uniform yet spread (perplexity about 22 of 81, the
likeliest grid about 0.2). Its drafters are separately seeded models of the same kind, far from it (total
variation about 0.8 between the joints), so a speculative method that forgets a correction is visibly wrong.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from scipy import stats as scipy_stats

from mulo_sd.decoding.neighbours import codebook_neighbours
from mulo_sd.nets.downsampler import Downsampler, DownsamplerConfig
from mulo_sd.nets.gpt import GPT
from mulo_sd.nets.upsampler import Upsampler, UpsamplerConfig
from tests import helpers

VOCAB = 3
GRID = (2, 2)
COND = torch.tensor([[1, 4, 7]])  # caption word ids
ALPHA = 1e-3  # significance level of every goodness-of-fit test
MIN_EXPECTED = 5.0  # cells expecting fewer samples are pooled (the chi-square approximation needs ~5)


def tiny_gpt(grid: tuple[int, int], seed: int) -> GPT:
    """A random 1-block GPT over VOCAB in float64 (cached and full forwards agree to ~1e-15, far below any
    draw's margin), its output head scaled to the spread the module docstring describes."""
    return helpers.tiny_gpt(grid, VOCAB, seed, dim=16, n_layer=1, n_head=2, head_std=0.5)


def neighbour_table() -> torch.Tensor:
    """[VOCAB, VOCAB - 1] codebook neighbours of a random unit-norm codebook."""
    vectors = torch.randn(VOCAB, 4, generator=torch.Generator().manual_seed(3))
    codebook = torch.nn.functional.normalize(vectors, dim=-1)
    return codebook_neighbours(codebook, VOCAB - 1)


def tiny_samplers(r: int, seed: int) -> tuple[Upsampler, Downsampler]:
    """A random learned up-sampler and down-sampler of scale r (one row-causal block each)."""
    torch.manual_seed(seed)
    fields = dict(r=r, codebook_size=VOCAB, code_dim=4, embedding="learned", width=8, blocks=1)
    codebook = torch.randn(VOCAB, 4)
    upsampler = Upsampler(UpsamplerConfig(**fields), codebook).eval()
    downsampler = Downsampler(DownsamplerConfig(**fields), codebook).eval()
    return upsampler, downsampler


@dataclass
class Fit:
    """Pearson's chi-square of sampled grids against a joint distribution, rare cells pooled."""

    statistic: float
    pvalue: float
    dof: int
    impossible: int  # samples of grids whose probability is exactly 0 (proof of a wrong sampler)


def pool_cells(joint: torch.Tensor, samples: int) -> np.ndarray:
    """Bins over the possible grids -> membership [cells, bins] (0/1): every grid expecting fewer than
    MIN_EXPECTED of `samples` goes to one pooled bin, topped up with the next least likely grids until that
    bin expects MIN_EXPECTED; every other grid is a bin of its own. Impossible grids are in no bin."""
    expected = joint.double().numpy() * samples
    possible = np.flatnonzero(expected > 0)
    order = possible[np.argsort(expected[possible], kind="stable")]
    pooled = int((expected[order] < MIN_EXPECTED).sum())
    while 0 < pooled < len(order) and expected[order[:pooled]].sum() < MIN_EXPECTED:
        pooled += 1
    bins = ([order[:pooled]] if pooled else []) + [order[i : i + 1] for i in range(pooled, len(order))]
    membership = np.zeros((len(expected), len(bins)))
    for b, cells in enumerate(bins):
        membership[cells, b] = 1.0
    return membership


def goodness_of_fit(grid_ids: torch.Tensor, joint: torch.Tensor) -> Fit:
    """grid_ids int64 [S] (rows of reference_sampler.all_grids) against `joint` [cells] -> Fit."""
    counts = np.bincount(grid_ids.cpu().numpy(), minlength=len(joint)).astype(float)
    probs = joint.double().numpy()
    probs = probs / probs.sum()
    membership = pool_cells(joint, len(grid_ids))
    observed, expected = counts @ membership, probs @ membership * len(grid_ids)
    statistic, pvalue = scipy_stats.chisquare(observed, expected * observed.sum() / expected.sum())
    impossible = int(counts[probs == 0].sum())
    return Fit(float(statistic), float(pvalue), len(observed) - 1, impossible)


def power(joint: torch.Tensor, wrong: torch.Tensor, samples: int) -> float:
    """Probability that goodness_of_fit against `joint` rejects at ALPHA when `samples` grids come from
    `wrong` (non-central chi-square with the binning the test uses)."""
    membership = pool_cells(joint, samples)
    p = joint.double().numpy() @ membership
    q = wrong.double().numpy() @ membership
    noncentrality = samples * float(((q / q.sum() - p / p.sum()) ** 2 / (p / p.sum())).sum())
    dof = membership.shape[1] - 1
    return float(scipy_stats.ncx2.sf(scipy_stats.chi2.isf(ALPHA, dof), dof, noncentrality))
