"""The exactness checks of test_exactness.py with the speculative methods decoding their images together
(lockstep batches with one generator per image, docs/batching.md): the grids of a batch must follow the
enumerated joint as the one-at-a-time decodes do (same sample sizes, models and bars)."""

import pytest
import torch

from mulo_sd.decoding.methods import decode_lantern, decode_mulo
from tests.decoding.test_exactness import (
    EXACT_MULO,
    MULO_SAMPLER,
    QUICK,
    SAMPLER,
    assert_follows,
    conds,
    drafter,  # noqa: F401 (fixture)
    goodness_of_fit,
    grid_ids,
    joint,  # noqa: F401 (fixture)
    mulo_models,  # noqa: F401 (fixture)
    neighbour_table,
    target,  # noqa: F401 (fixture)
)

BATCH = 100  # images decoded together; QUICK / BATCH batches


def batched(decode, seed: int) -> tuple[torch.Tensor, list]:
    """QUICK grids in batches of BATCH, image i drawing from its own generator -> (tokens, batch stats)."""
    tokens, stats = [], []
    for first in range(0, QUICK, BATCH):
        generators = [torch.Generator().manual_seed(seed * 100_000 + first + i) for i in range(BATCH)]
        result = decode(conds(BATCH), generators)
        tokens.append(result.tokens)
        stats.append(result.stats)
    return torch.cat(tokens), stats


@pytest.mark.parametrize("draft_len", [1, 3])
def test_batched_lantern_delta_zero_follows_the_joint(target, drafter, joint, draft_len):  # noqa: F811
    def decode(cond, generators):
        return decode_lantern(
            target, drafter, cond, SAMPLER, generators, k=2, delta=0.0, neighbours=neighbour_table(),
            draft_len=draft_len,
        )  # fmt: skip

    tokens, stats = batched(decode, seed=4)
    assert_follows(tokens, joint)
    assert all(len(s.per_image) == BATCH for s in stats)  # really decoded in lockstep
    assert sum(s.tokens_accepted for s in stats) > 0 and sum(s.tokens_rejected for s in stats) > 0


def mulo_decode(models, rejection, l):
    def decode(cond, generators):
        return decode_mulo(
            *models, cond, MULO_SAMPLER, generators, tau=1.0, k=0, neighbours=neighbour_table(),
            rejection=rejection, l=l,
        )  # fmt: skip

    return decode


@pytest.mark.parametrize("rejection, l", EXACT_MULO)
def test_batched_mulo_exact_mode_follows_the_joint(mulo_models, rejection, l):  # noqa: F811
    models, joint_ = mulo_models
    tokens, stats = batched(mulo_decode(models, rejection, l), seed=5)
    assert_follows(tokens, joint_)
    assert all(len(s.per_image) == BATCH for s in stats)
    assert sum(s.tokens_accepted for s in stats) > 0 and sum(s.tokens_resampled for s in stats) > 0


def test_batched_mulo_naive_rejection_is_not_exact(mulo_models):  # noqa: F811
    models, joint_ = mulo_models
    tokens, _ = batched(mulo_decode(models, "naive", 1), seed=6)
    assert goodness_of_fit(grid_ids(tokens), joint_).impossible > 0
