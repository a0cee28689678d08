"""Distribution exactness: sampled grids against the enumerated joint (tests/reference_sampler.py).

A method is exact when its grids follow P(grid) = prod_i p(x_i | x_<i, cond), p being the guided, processed
distribution plain AR sampling draws from (docs/algorithm.md sections 3 and 9). On a 2 x 2 grid of vocabulary
3 every grid's probability is enumerated by cache-free forwards; many sampled grids are then compared with it
by Pearson's chi-square (grids expecting < 5 samples pooled, exactly impossible grids must never appear,
fixed seeds), rejecting at p < ALPHA = 1e-3. Each check's power against a realistic bug is computed from the
non-central chi-square at the sample size used (`test_*_power*`), and the same check is shown to fail on
grids drawn from such a wrong distribution.

Exact modes: AR; ZipAR with window >= the grid width (no stand-in is ever fed); LANTERN with delta = 0
(speculative sampling: accept with min(1, p/q), resample from norm(max(0, p - q))). MuLo-SD's accept rule is
a deterministic threshold, not a min(1, p/q) test, so it has no distribution-exact mode with a stochastic
accept; its exact mode is tau = 1, k = 0: a draft is kept only where the processed p is one-hot on it (top-p
or top-k can make it so), every other position is sampled from p. That is exact with rejection='raster' and
with 'local' when l >= max(H, W) (the islands then cover every position from t0 on); 'naive' is not, shown
here by grids it produces that AR never can.

The per-image methods (LANTERN, MuLo-SD) decode 50-200 images a second on one CPU core (by load), so the
quick tests use QUICK = 300 images: power > 0.99 against resampling from p instead of the residual, only 0.17
against sampling at temperature 1.2 instead of 1; the `slow` ones repeat them with SLOW = 2000 images (power
> 0.99 against temperature 1.2), as the batched methods (AR, ZipAR) do in the quick suite with 4000.
"""

from __future__ import annotations

import pytest
import torch

from mulo_sd.decoding.methods import decode_ar, decode_lantern, decode_mulo, decode_zipar
from mulo_sd.decoding.sampling import SamplerConfig
from tests.exactness_fixtures import (
    ALPHA,
    COND,
    GRID,
    MIN_EXPECTED,
    VOCAB,
    goodness_of_fit,
    neighbour_table,
    pool_cells,
    power,
    tiny_gpt,
    tiny_samplers,
)
from tests.reference_sampler import all_grids, conditionals, grid_index, joint_distribution, reference_sample

SAMPLER = SamplerConfig(temperature=1.0, cfg_scale=2.0)  # guided; every one of the 81 grids is possible
# MuLo-SD's exact mode keeps only drafts that p is one-hot on: top-p 0.7 makes position 0 and about 70% of
# positions 2 and 3 one-hot for this target (5 possible grids), so drafts are accepted as well as resampled
MULO_SAMPLER = SamplerConfig(temperature=1.0, cfg_scale=2.0, top_p=0.7)
BATCHED = 4000  # grids for the methods that decode a whole batch at once (AR, ZipAR): ~0.5 s
QUICK = 300  # grids for the per-image methods in the quick suite: 3-4 s each
SLOW = 2000


def grid_ids(tokens: torch.Tensor) -> torch.Tensor:
    return grid_index(tokens.flatten(1).cpu(), VOCAB)


def assert_follows(tokens: torch.Tensor, joint: torch.Tensor):
    fit = goodness_of_fit(grid_ids(tokens), joint)
    assert fit.impossible == 0, f"{fit.impossible} sampled grids have probability 0"
    assert fit.pvalue > ALPHA, f"chi-square {fit.statistic:.1f} on {fit.dof} dof: p = {fit.pvalue:.2g}"
    return fit


def conds(n: int) -> torch.Tensor:
    return COND.expand(n, -1)


@pytest.fixture(scope="module")
def target():
    return tiny_gpt(GRID, 0)


@pytest.fixture(scope="module")
def drafter():
    return tiny_gpt(GRID, 10)  # LANTERN's: same grid, separately seeded, far from the target


@pytest.fixture(scope="module")
def joint(target):
    return joint_distribution(target, COND, SAMPLER)


def resampled_from_p_joint(target, drafter, sampler) -> torch.Tensor:
    """The joint a one-token speculative sampler gives when it resamples a rejection from p instead of the
    residual norm(max(0, p - q)): per position min(p, q) + (1 - sum min(p, q)) * p (a classic bug)."""
    grids = all_grids(VOCAB, GRID[0] * GRID[1])
    p = conditionals(target, grids, COND, sampler).double()
    q = conditionals(drafter, grids, COND, sampler).double()
    overlap = torch.minimum(p, q)
    wrong = overlap + (1 - overlap.sum(-1, keepdim=True)) * p
    return wrong.gather(-1, grids[..., None])[..., 0].prod(-1)


# ---- the reference itself ------------------------------------------------------------------------------


def test_joint_is_a_spread_distribution_far_from_uniform(joint):
    assert joint.sum().item() == pytest.approx(1.0, abs=1e-6)  # float32 conditionals, 4 factors
    perplexity = torch.exp(-(joint * joint.log()).sum()).item()
    assert 10 < perplexity < 40  # of 81 grids: neither near-deterministic nor near-uniform
    assert joint.max().item() < 0.3


def test_every_bin_expects_enough_samples_and_holds_every_possible_grid(joint):
    for samples in (QUICK, BATCHED):
        membership = pool_cells(joint, samples)
        assert (joint.double().numpy() @ membership * samples).min() >= MIN_EXPECTED
        assert (membership.sum(1) == (joint > 0).numpy()).all()  # each possible grid in exactly one bin


def test_cached_ar_draws_the_reference_samplers_tokens(target):
    # same draws in the same order: equal distributions give equal tokens, grid for grid
    expected = reference_sample(target, conds(500), SAMPLER, torch.Generator().manual_seed(5))
    result = decode_ar(target, conds(500), SAMPLER, torch.Generator().manual_seed(5))
    assert torch.equal(result.tokens, expected)


def test_reference_sampler_follows_the_enumerated_joint(target, joint):
    tokens = reference_sample(target, conds(BATCHED), SAMPLER, torch.Generator().manual_seed(1))
    assert_follows(tokens, joint)


def test_check_has_power_and_fails_on_a_slightly_wrong_sampler(target, joint):
    # the reference sampler at temperature 1.2 instead of 1.0: a small processing bug
    wrong_sampler = SamplerConfig(temperature=1.2, cfg_scale=2.0)
    wrong = joint_distribution(target, COND, wrong_sampler)
    assert power(joint, wrong, SLOW) > 0.99 and power(joint, wrong, BATCHED) > 0.99
    tokens = reference_sample(target, conds(BATCHED), wrong_sampler, torch.Generator().manual_seed(1))
    assert goodness_of_fit(grid_ids(tokens), joint).pvalue < ALPHA


def test_quick_check_has_power_against_resampling_from_p(target, drafter, joint):
    wrong = resampled_from_p_joint(target, drafter, SAMPLER)
    assert power(joint, wrong, QUICK) > 0.99
    generator = torch.Generator().manual_seed(2)
    ids = torch.multinomial(wrong.float(), QUICK, replacement=True, generator=generator)
    assert goodness_of_fit(ids, joint).pvalue < ALPHA


# ---- the methods -----------------------------------------------------------------------------------------


def test_ar_follows_the_joint(target, joint):
    result = decode_ar(target, conds(BATCHED), SAMPLER, torch.Generator().manual_seed(2))
    assert_follows(result.tokens, joint)


@pytest.mark.parametrize("window", [GRID[1], GRID[1] + 3])
def test_zipar_with_window_at_least_the_width_follows_the_joint(target, joint, window):
    result = decode_zipar(target, conds(BATCHED), SAMPLER, torch.Generator().manual_seed(3), window=window)
    assert_follows(result.tokens, joint)


def test_zipar_below_the_width_is_detected(target, joint):
    # window 1 predicts row 1's first token from a stand-in: an approximation the check must see
    result = decode_zipar(target, conds(BATCHED), SAMPLER, torch.Generator().manual_seed(3), window=1)
    assert goodness_of_fit(grid_ids(result.tokens), joint).pvalue < ALPHA


def lantern(target, drafter, samples, draft_len, seed=4):
    return decode_lantern(
        target, drafter, conds(samples), SAMPLER, torch.Generator().manual_seed(seed), k=2, delta=0.0,
        neighbours=neighbour_table(), draft_len=draft_len,
    )  # fmt: skip


@pytest.mark.parametrize("draft_len", [1, 2, 3])
def test_lantern_delta_zero_follows_the_joint(target, drafter, joint, draft_len):
    result = lantern(target, drafter, QUICK, draft_len)
    assert_follows(result.tokens, joint)
    stats = result.stats
    assert stats.tokens_accepted > 0 and stats.tokens_rejected > 0  # both branches of the rule ran


@pytest.mark.slow
@pytest.mark.parametrize("draft_len", [1, 2, 3])
def test_lantern_delta_zero_follows_the_joint_many_samples(target, drafter, joint, draft_len):
    assert_follows(lantern(target, drafter, SLOW, draft_len, seed=14).tokens, joint)


@pytest.fixture(scope="module")
def mulo_models():
    """Target (seed 1: p one-hot often enough under MULO_SAMPLER), a 1 x 1 drafter, r = 2 samplers (seed 4:
    their drafts often match the one-hot tokens, about 1.8 kept per image with 'raster'); and the target's
    joint under MULO_SAMPLER."""
    target = tiny_gpt(GRID, 1)
    upsampler, downsampler = tiny_samplers(2, 4)
    models = (target, tiny_gpt((1, 1), 20), upsampler, downsampler)
    return models, joint_distribution(target, COND, MULO_SAMPLER)


def mulo(models, samples, rejection, l=1, seed=5):
    return decode_mulo(
        *models, conds(samples), MULO_SAMPLER, torch.Generator().manual_seed(seed), tau=1.0, k=0,
        neighbours=neighbour_table(), rejection=rejection, l=l,
    )  # fmt: skip


EXACT_MULO = [("raster", 1), ("local", max(GRID))]


@pytest.mark.parametrize("rejection, l", EXACT_MULO)
def test_mulo_exact_mode_follows_the_joint(mulo_models, rejection, l):
    models, joint = mulo_models
    assert (joint > 0).sum() >= 5
    result = mulo(models, QUICK, rejection, l)
    assert_follows(result.tokens, joint)
    stats = result.stats
    assert stats.tokens_accepted > 0 and stats.tokens_resampled > 0  # drafts kept and positions resampled


@pytest.mark.slow
@pytest.mark.parametrize("rejection, l", EXACT_MULO)
def test_mulo_exact_mode_follows_the_joint_many_samples(mulo_models, rejection, l):
    models, joint = mulo_models
    assert_follows(mulo(models, SLOW, rejection, l, seed=15).tokens, joint)


def test_mulo_naive_rejection_is_not_exact(mulo_models):
    # docs/algorithm.md section 9: drafts after t0 were judged with the rejected drafts as context and are
    # kept, so 'naive' makes grids whose probability under AR is exactly 0
    models, joint = mulo_models
    fit = goodness_of_fit(grid_ids(mulo(models, QUICK, "naive").tokens), joint)
    assert fit.impossible > 0
