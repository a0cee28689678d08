import pytest
import torch

from mulo_sd.decoding.accept import (
    accept_pooled,
    check_neighbour_knobs,
    lantern_relaxed_probability,
    lantern_residual,
    pooled_probability,
)
from mulo_sd.decoding.methods import decode_mulo
from mulo_sd.decoding.neighbours import cached_neighbours, codebook_neighbours
from mulo_sd.decoding.sampling import SamplerConfig, process_logits


def test_neighbours_are_the_nearest_entries_nearest_first():
    codebook = torch.nn.functional.normalize(
        torch.randn(12, 3, generator=torch.Generator().manual_seed(0)), dim=-1
    )
    table = codebook_neighbours(codebook, 5, chunk_size=5)  # several chunks
    assert table.shape == (12, 5) and table.dtype == torch.long
    distances = torch.cdist(codebook, codebook)
    for v in range(12):
        assert v not in table[v].tolist()
        others = [u for u in range(12) if u != v]
        expected = sorted(others, key=lambda u: (distances[v, u].item(), u))[:5]
        assert table[v].tolist() == expected


def test_neighbour_ties_ordered_by_id():
    # entries 1, 2, 3 coincide: from 0 they are equally far and come in id order
    codebook = torch.tensor([[0.0, 0.0], [1.0, 0.0], [1.0, 0.0], [1.0, 0.0], [5.0, 0.0]])
    table = codebook_neighbours(codebook, 4)
    assert table[0].tolist() == [1, 2, 3, 4]
    assert table[2].tolist()[:2] == [1, 3]


def test_neighbour_errors():
    with pytest.raises(ValueError, match=r"k must lie in \[0, 4\)"):
        codebook_neighbours(torch.randn(4, 2), 4)
    with pytest.raises(ValueError, match="codebook must be"):
        codebook_neighbours(torch.randn(4), 1)


def test_cached_neighbours_reuses_and_rebuilds(tmp_path):
    path = tmp_path / "neighbours.safetensors"
    codebook = torch.randn(10, 3, generator=torch.Generator().manual_seed(1))
    table = cached_neighbours(codebook, 4, path)
    assert path.is_file() and torch.equal(table, codebook_neighbours(codebook, 4))
    assert torch.equal(cached_neighbours(codebook, 2, path), table[:, :2])  # fewer columns: read back
    other = codebook.flip(0)
    assert torch.equal(
        cached_neighbours(other, 4, path), codebook_neighbours(other, 4)
    )  # new codebook: rebuilt


def test_pooled_probability_and_accept_rule():
    probs = torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.5, 0.0, 0.25, 0.25]])
    neighbours = torch.tensor([[1, 2, 3], [0, 2, 3], [3, 1, 0], [2, 1, 0]])
    tokens = torch.tensor([0, 2])
    assert torch.allclose(pooled_probability(probs, tokens, neighbours, 0), torch.tensor([0.1, 0.25]))
    assert torch.allclose(pooled_probability(probs, tokens, neighbours, 2), torch.tensor([0.6, 0.5]))
    assert accept_pooled(probs, tokens, neighbours, 2, 0.55).tolist() == [True, False]
    assert accept_pooled(probs, tokens, neighbours, 0, 0.0).all()  # tau = 0 accepts everything


def test_typical_rule_lowers_the_bar_by_the_perplexity():
    # row 0: uniform over 4 codes (perplexity 4); row 1: one-hot (perplexity 1)
    probs = torch.tensor([[0.25, 0.25, 0.25, 0.25], [0.0, 1.0, 0.0, 0.0]])
    neighbours = torch.tensor([[1, 2, 3], [0, 2, 3], [3, 1, 0], [2, 1, 0]])
    tokens = torch.tensor([0, 0])
    # absolute at tau 0.5: both fail (0.25 and 0); typical: bars 0.5 / 4 = 0.125 and 0.5
    assert accept_pooled(probs, tokens, neighbours, 0, 0.5).tolist() == [False, False]
    assert accept_pooled(probs, tokens, neighbours, 0, 0.5, "typical").tolist() == [True, False]
    # row 0's bar is tau / 4: passed at tau 0.99, not at 1.0 + 1e-3 (tau's range check is decode_mulo's)
    assert accept_pooled(probs, tokens, neighbours, 0, 0.99, "typical").tolist() == [True, False]
    assert accept_pooled(probs, tokens, neighbours, 0, 1.001, "typical").tolist() == [False, False]
    with pytest.raises(ValueError, match="accept_rule must be one of"):
        accept_pooled(probs, tokens, neighbours, 0, 0.5, "relative")


def test_accept_floor_keeps_the_typical_bar_from_vanishing_where_the_target_is_unsure():
    # row 0: uniform over 50 codes (a textured background: perplexity 50); row 1: 0.9 on code 1, the rest
    # spread (the target is sure); the draft is code 0 in both, pooled alone (k = 0)
    flat = torch.full((50,), 1 / 50)
    sure = torch.cat([torch.tensor([0.1 / 49, 0.9]), torch.full((48,), 0.1 / 49)])
    probs = torch.stack([flat, sure])
    neighbours = codebook_neighbours(torch.randn(50, 4, generator=torch.Generator().manual_seed(4)), 3)
    tokens = torch.tensor([0, 1])
    # typical, tau 0.5: bars 0.5 / 50 = 0.01 (the flat row's 0.02 passes) and 0.5 exp(-H) ~ 0.25 (0.9 does)
    assert accept_pooled(probs, tokens, neighbours, 0, 0.5, "typical").tolist() == [True, True]
    # a floor of 0.03 lifts only the flat row's bar (0.02 < 0.03 fails); the sure row's bar is above it
    assert accept_pooled(probs, tokens, neighbours, 0, 0.5, "typical", floor=0.03).tolist() == [False, True]
    assert accept_pooled(probs, tokens, neighbours, 0, 0.5, "typical", floor=0.02).tolist() == [True, True]
    # a floor above the sure row's bar reaches it too; absolute: the bar is max(floor, tau)
    assert accept_pooled(probs, tokens, neighbours, 0, 0.5, "typical", floor=0.95).tolist() == [False, False]
    assert accept_pooled(probs, tokens, neighbours, 0, 0.01, "absolute", floor=0.03).tolist() == [False, True]


@pytest.mark.parametrize("rule", ["absolute", "typical"])
def test_accept_floor_sits_between_the_rule_and_the_absolute_rule_at_the_floor(rule):
    logits = 3 * torch.randn(200, 64, generator=torch.Generator().manual_seed(5))
    probs = process_logits(logits, SamplerConfig(temperature=1.0, top_k=32))
    tokens = torch.randint(0, 64, (200,), generator=torch.Generator().manual_seed(6))
    neighbours = codebook_neighbours(torch.randn(64, 4, generator=torch.Generator().manual_seed(7)), 4)
    tau = 0.05
    rule_alone = accept_pooled(probs, tokens, neighbours, 4, tau, rule)
    assert torch.equal(accept_pooled(probs, tokens, neighbours, 4, tau, rule, floor=0.0), rule_alone)
    for floor in (0.002, 0.01, 0.05, 0.2):
        floored = accept_pooled(probs, tokens, neighbours, 4, tau, rule, floor=floor)
        strictest = accept_pooled(probs, tokens, neighbours, 4, max(tau, floor), "absolute")
        assert not (floored & ~rule_alone).any()  # it only ever rejects more than the rule
        assert not (strictest & ~floored).any()  # and never more than the absolute rule at max(tau, floor)
        if floor >= tau:  # the floor is the bar wherever the typical one is below it: everywhere
            assert torch.equal(floored, strictest)
    assert rule_alone.sum() > accept_pooled(probs, tokens, neighbours, 4, tau, rule, floor=0.2).sum()


def test_accept_floor_range_is_checked():
    for floor in (-0.01, 1.5):
        with pytest.raises(ValueError, match=r"accept_floor must lie in \[0, 1\]"):
            decode_mulo(
                None, None, None, None, torch.tensor([[1]]), SamplerConfig(), torch.Generator(), tau=0.1,
                k=0, neighbours=torch.zeros(4, 1, dtype=torch.long), accept_floor=floor,
            )  # fmt: skip


@pytest.mark.parametrize("rule", ["absolute", "typical"])
def test_greedy_tau_one_accepts_exactly_the_argmax(rule):
    logits = torch.randn(50, 16, generator=torch.Generator().manual_seed(2))
    probs = process_logits(logits, SamplerConfig(temperature=0.0))
    tokens = torch.randint(0, 16, (50,), generator=torch.Generator().manual_seed(3))
    tokens[:10] = logits[:10].argmax(-1)
    neighbours = codebook_neighbours(torch.randn(16, 4), 3)
    assert torch.equal(accept_pooled(probs, tokens, neighbours, 0, 1.0, rule), tokens == logits.argmax(-1))
    for floor in (0.3, 1.0):  # a floor leaves the bar at 1: still exactly the argmax
        accepted = accept_pooled(probs, tokens, neighbours, 0, 1.0, rule, floor=floor)
        assert torch.equal(accepted, tokens == logits.argmax(-1))


def test_neighbour_knob_errors():
    table = torch.zeros(8, 3, dtype=torch.long)
    with pytest.raises(ValueError, match=r"k must lie in \[0, 8\)"):
        check_neighbour_knobs(table, 8, 8)
    with pytest.raises(ValueError, match=r"k must lie in \[0, 8\)"):
        check_neighbour_knobs(table, -1, 8)
    with pytest.raises(ValueError, match="exceeds the neighbour table's 3 columns"):
        check_neighbour_knobs(table, 4, 8)
    with pytest.raises(ValueError, match=r"neighbours must be a \[V=9, K\] table"):
        check_neighbour_knobs(table, 1, 9)


def test_lantern_relaxation_pools_neighbours_up_to_delta():
    probs = torch.tensor([[0.2, 0.1, 0.2, 0.3, 0.2]])
    neighbours = torch.tensor([[1, 2, 3, 4]] * 5)  # token 0's neighbours: 1, 2, 3, 4 (c = .1, .3, .6, .8)
    token = torch.tensor([0])
    for delta, pooled in ((0.0, 0.0), (0.05, 0.0), (0.1, 0.1), (0.35, 0.3), (1.0, 0.8)):
        relaxed, mass = lantern_relaxed_probability(probs, token, neighbours, 4, delta)
        assert torch.allclose(mass, torch.tensor([pooled])) and torch.allclose(
            relaxed, torch.tensor([0.2 + pooled])
        )
    relaxed, mass = lantern_relaxed_probability(probs, token, neighbours, 1, 1.0)  # only n_1 allowed
    assert torch.allclose(relaxed, torch.tensor([0.3]))


def test_lantern_residual_zeroes_the_neighbourhood_only_when_mass_was_pooled():
    p = torch.tensor([0.1, 0.4, 0.3, 0.2])
    q = torch.tensor([0.5, 0.3, 0.1, 0.1])
    neighbours = torch.tensor([[1, 2, 3]] * 4)
    standard = (p - q).clamp(min=0) / (p - q).clamp(min=0).sum()
    assert torch.allclose(lantern_residual(p, q, 0, neighbours, 2, pooled=0.0), standard)
    relaxed = torch.tensor([0.0, 0.4, 0.3, 0.1]) / 0.8  # q zeroed on 1, 2; v = 0 keeps q(0)
    assert torch.allclose(lantern_residual(p, q, 0, neighbours, 2, pooled=0.4), relaxed)


def simulate_lantern(p, q, neighbours, k, delta, draws, seed):
    """Draft v ~ q, accept with min(1, p~/q), else resample from the residual: the output ids."""
    generator = torch.Generator().manual_seed(seed)
    drafts = torch.multinomial(q, draws, replacement=True, generator=generator)
    relaxed, pooled = lantern_relaxed_probability(p.expand(draws, -1), drafts, neighbours, k, delta)
    accept = torch.rand(draws, generator=generator) < relaxed / q[drafts]
    out = drafts.clone()
    for v in out[~accept].unique().tolist():  # the residual depends on v only
        rows = (~accept & (drafts == v)).nonzero()[:, 0]
        residual = lantern_residual(p, q, v, neighbours, k, float(pooled[rows[0]]))
        out[rows] = torch.multinomial(residual, len(rows), replacement=True, generator=generator)
    return out


def test_lantern_with_delta_zero_samples_the_target_distribution():
    # standard speculative sampling: the output follows p whatever q is; p has zero-mass entries (top-k)
    p = torch.tensor([0.0, 0.5, 0.0, 0.3, 0.2, 0.0])
    q = torch.tensor([0.3, 0.1, 0.2, 0.1, 0.1, 0.2])
    neighbours = codebook_neighbours(torch.randn(6, 2, generator=torch.Generator().manual_seed(4)), 5)
    draws = 200_000
    out = simulate_lantern(p, q, neighbours, k=5, delta=0.0, draws=draws, seed=5)
    frequencies = torch.bincount(out, minlength=6).float() / draws
    assert (frequencies - p).abs().max() < 0.006
    # a positive delta accepts more drafts, so the output drifts towards q
    relaxed = simulate_lantern(p, q, neighbours, k=5, delta=0.3, draws=draws, seed=5)
    assert (torch.bincount(relaxed, minlength=6).float() / draws - p).abs().max() > 0.02
