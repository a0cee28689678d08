import math

import pytest
import torch

from mulo_sd.decoding.sampling import SamplerConfig, process_logits, sample
from mulo_sd.nets.guidance import guide


def logits_of(probs):
    return torch.tensor(probs).log()


def test_config_rejects_bad_values():
    with pytest.raises(ValueError, match="temperature must be >= 0"):
        SamplerConfig(temperature=-1.0)
    with pytest.raises(ValueError, match="top_k must be >= 0"):
        SamplerConfig(top_k=-2)
    with pytest.raises(ValueError, match=r"top_p must be in \(0, 1\]"):
        SamplerConfig(top_p=0.0)


def test_temperature_zero_is_one_hot_argmax():
    logits = torch.randn(2, 3, 16, generator=torch.Generator().manual_seed(0))
    probs = process_logits(logits, SamplerConfig(temperature=0.0, top_k=5, top_p=0.5))
    assert probs.dtype == torch.float32
    assert torch.equal(probs, torch.nn.functional.one_hot(logits.argmax(-1), 16).float())


def test_temperature_scales_logits():
    logits = torch.randn(4, 10, generator=torch.Generator().manual_seed(1))
    probs = process_logits(logits, SamplerConfig(temperature=0.5))
    assert torch.allclose(probs, (logits / 0.5).softmax(-1))
    assert torch.allclose(process_logits(logits, SamplerConfig()), logits.softmax(-1))


def test_top_k_keeps_exactly_the_k_largest():
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(2))
    probs = process_logits(logits, SamplerConfig(top_k=7))
    assert ((probs > 0).sum(-1) == 7).all()
    top = logits.topk(7, dim=-1).indices
    kept = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, top, True)
    assert torch.equal(probs > 0, kept)
    expected = logits.masked_fill(~kept, float("-inf")).softmax(-1)
    assert torch.allclose(probs, expected)
    assert torch.allclose(probs.sum(-1), torch.ones(3))


def test_top_k_keeps_ties_at_the_boundary_and_large_k_is_off():
    logits = torch.tensor([3.0, 1.0, 1.0, 0.0])
    assert (process_logits(logits, SamplerConfig(top_k=2)) > 0).tolist() == [True, True, True, False]
    assert torch.allclose(process_logits(logits, SamplerConfig(top_k=100)), logits.softmax(-1))


@pytest.mark.parametrize(
    "top_p, kept",
    [(0.4, [0.5]), (0.5, [0.5]), (0.75, [0.5, 0.3]), (0.85, [0.5, 0.3, 0.15]), (1.0, [0.5, 0.3, 0.15, 0.05])],
)
def test_top_p_keeps_the_shortest_prefix_reaching_p(top_p, kept):
    order = [2, 0, 3, 1]  # vocabulary order differs from probability order
    probs_by_rank = [0.5, 0.3, 0.15, 0.05]
    probs = [0.0] * 4
    for rank, token in enumerate(order):
        probs[token] = probs_by_rank[rank]
    out = process_logits(logits_of(probs), SamplerConfig(top_p=top_p))
    expected = torch.zeros(4)
    for rank, token in enumerate(order[: len(kept)]):
        expected[token] = probs_by_rank[rank] / sum(kept)
    assert torch.allclose(out, expected, atol=1e-6)


def test_top_k_applies_before_top_p():
    # top-k first renormalises [0.5, 0.3] to [0.625, 0.375], so top-p 0.6 keeps one token; top-p on the
    # full distribution would keep two
    out = process_logits(logits_of([0.5, 0.3, 0.2]), SamplerConfig(top_k=2, top_p=0.6))
    assert torch.allclose(out, torch.tensor([1.0, 0.0, 0.0]))


def test_guide_by_hand():
    cond, uncond = torch.tensor([1.0, 2.0, -1.0]), torch.tensor([0.0, 1.0, 1.0])
    assert torch.allclose(guide(cond, uncond, 3.0), torch.tensor([3.0, 4.0, -5.0]))
    assert torch.equal(guide(cond, uncond, 1.0), cond)
    assert torch.equal(guide(cond, uncond, 0.0), uncond)


def test_sample_uses_the_generator():
    flat = torch.full((2, 32, 1000), 1e-3)
    first = sample(flat, torch.Generator().manual_seed(5))
    assert first.shape == (2, 32) and first.dtype == torch.long
    assert torch.equal(first, sample(flat, torch.Generator().manual_seed(5)))
    assert not torch.equal(first, sample(flat, torch.Generator().manual_seed(6)))


def test_sample_follows_the_distribution():
    one_hot = torch.nn.functional.one_hot(torch.tensor([[3, 0], [7, 9]]), 10).float()
    assert sample(one_hot, torch.Generator().manual_seed(0)).tolist() == [[3, 0], [7, 9]]
    ids = sample(torch.tensor([0.2, 0.8]).expand(4000, 2), torch.Generator().manual_seed(0))
    assert math.isclose(ids.float().mean().item(), 0.8, abs_tol=0.03)


def test_sample_refuses_a_generator_on_another_device():
    with pytest.raises(ValueError, match="generator is on cpu but probs are on meta"):
        sample(torch.ones(2, 4, device="meta"), torch.Generator())
