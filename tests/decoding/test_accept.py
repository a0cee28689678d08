import pytest
import torch

from mulo_sd.decoding.accept import (
    accept_pooled,
    check_neighbour_knobs,
    lantern_relaxed_probability,
    lantern_residual,
    pooled_probability,
)
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


@pytest.mark.parametrize("rule", ["absolute", "typical"])
def test_greedy_tau_one_accepts_exactly_the_argmax(rule):
    logits = torch.randn(50, 16, generator=torch.Generator().manual_seed(2))
    probs = process_logits(logits, SamplerConfig(temperature=0.0))
    tokens = torch.randint(0, 16, (50,), generator=torch.Generator().manual_seed(3))
    tokens[:10] = logits[:10].argmax(-1)
    neighbours = codebook_neighbours(torch.randn(16, 4), 3)
    assert torch.equal(accept_pooled(probs, tokens, neighbours, 0, 1.0, rule), tokens == logits.argmax(-1))


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
