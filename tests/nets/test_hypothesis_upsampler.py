"""An up-sampler of several hypotheses (UpsamplerConfig.hypotheses): each hypothesis is the same network with
its own shift before the last block; `all_hypotheses` equals calling each one, the winner-takes-all loss
trains each grid's best hypothesis only, and bad hypothesis ids are refused."""

import pytest
import torch
from mulo_sd.training.losses import hypothesis_cross_entropy

from mulo_sd.nets.upsampler import Upsampler, UpsamplerConfig
from tests.nets.test_caption_upsampler import WORDS, grid
from tests.nets.test_samplers import TINY, codebook


def model(hypotheses: int = 3, **overrides) -> Upsampler:
    torch.manual_seed(2)
    config = UpsamplerConfig(r=2, **{**TINY, **WORDS, "hypotheses": hypotheses, **overrides})
    return Upsampler(config, codebook()).eval()


def test_all_hypotheses_equals_each_hypothesis_alone_and_they_differ():
    up = model()
    ids, captions = grid(4, 4).repeat(2, 1, 1), torch.tensor([[1, 2, 3], [4, 0, 0]])
    every = up.all_hypotheses(ids, captions)["logits"]
    assert every.shape == (2, 3, TINY["codebook_size"], 8, 8)
    for k in range(3):
        alone = up(ids, captions, hypothesis=torch.full((2,), k))["logits"]
        torch.testing.assert_close(every[:, k], alone, rtol=0, atol=1e-6)
    assert not torch.allclose(every[:, 0], every[:, 1])
    # no hypothesis given: hypothesis 0
    assert torch.equal(
        up(ids, captions)["logits"], up(ids, captions, hypothesis=torch.zeros(2).long())["logits"]
    )


def test_rows_of_a_hypothesis_equal_those_rows_of_its_whole_grid():
    up = model(causal=True)
    ids, caption, one = grid(4, 4), torch.tensor([[1, 2, 3]]), torch.tensor([2])
    whole = up.upsample(ids, caption, None, one)
    rows = up.upsample_rows(ids, 2, cond=caption, hypothesis=one)
    assert torch.equal(rows, whole[:, 4:])


def test_bad_hypothesis_ids_are_refused():
    up, ids, caption = model(), grid(4, 4), torch.tensor([[1, 2, 3]])
    with pytest.raises(ValueError, match=r"lie in \[0, 3\)"):
        up(ids, caption, hypothesis=torch.tensor([3]))
    with pytest.raises(ValueError, match="int64"):
        up(ids, caption, hypothesis=torch.tensor([1.0]))
    with pytest.raises(ValueError, match="one hypothesis"):
        model(hypotheses=1)(ids, caption, hypothesis=torch.tensor([1]))
    with pytest.raises(ValueError, match="hypotheses must be >= 1"):
        model(hypotheses=0)


def test_winner_takes_all_trains_only_each_grid_s_best_hypothesis():
    logits = torch.randn(2, 3, 5, 2, 2, requires_grad=True)
    targets = torch.randint(0, 5, (2, 2, 2))
    loss, winners = hypothesis_cross_entropy(logits, targets, spread=0.0)
    per = torch.stack(
        [
            torch.nn.functional.cross_entropy(logits[:, k], targets, reduction="none").mean((1, 2))
            for k in range(3)
        ],
        1,
    )
    assert torch.equal(winners, per.argmin(1))
    torch.testing.assert_close(loss, per.min(1).values.mean())
    loss.backward()
    for b in range(2):
        for k in range(3):
            assert (logits.grad[b, k].abs().sum() > 0) == (k == winners[b])
    spread, _ = hypothesis_cross_entropy(logits, targets, spread=0.5)
    torch.testing.assert_close(spread, 0.5 * per.min(1).values.mean() + 0.5 * per.mean())
