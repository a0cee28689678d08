import pytest
import torch

from mulo_sd.decoding.methods import decode_ar, decode_lantern
from mulo_sd.decoding.neighbours import codebook_neighbours
from mulo_sd.decoding.sampling import SamplerConfig, process_logits
from tests.helpers import tiny_gpt

GREEDY = SamplerConfig(temperature=0.0)
COND = torch.tensor([[1, 4, 7], [2, 2, 9]])


def table(vocab, k):
    codebook = torch.nn.functional.normalize(
        torch.randn(vocab, 4, generator=torch.Generator().manual_seed(7)), dim=-1
    )
    return codebook_neighbours(codebook, k)


@pytest.fixture(scope="module")
def target():
    return tiny_gpt((6, 6), 32, 0)


@pytest.fixture(scope="module")
def drafter():
    return tiny_gpt((6, 6), 32, 1, dim=16, n_layer=1)  # smaller, same resolution


def check_accounting(stats, size=36):
    assert stats.tokens_accepted + stats.tokens_resampled == size * stats.batch_size  # each position once
    assert stats.tokens_rejected <= stats.tokens_resampled
    assert stats.sequential_steps == stats.target_forwards + stats.drafter_forwards
    assert stats.target_forwards == stats.batch_size + stats.cycles  # start + one verification per cycle
    assert stats.tokens_evaluated > 0 and stats.tokens_drafted >= stats.tokens_accepted


@pytest.mark.parametrize("delta", [0.0, 0.4])
@pytest.mark.parametrize("draft_len", [1, 4])
def test_greedy_lantern_equals_greedy_ar(target, drafter, delta, draft_len):
    # greedy p is one-hot: the neighbours pooled below any delta < 1 carry no mass, so every delta is exact
    expected = decode_ar(target, COND, GREEDY, torch.Generator().manual_seed(0)).tokens
    result = decode_lantern(
        target, drafter, COND, GREEDY, torch.Generator().manual_seed(0), k=6, delta=delta,
        neighbours=table(32, 8), draft_len=draft_len,
    )  # fmt: skip
    assert torch.equal(result.tokens, expected)
    assert result.stats.tokens_rejected > 0
    check_accounting(result.stats)


def test_self_drafting_accepts_everything(target):
    # drafter = target: every draft is accepted and each cycle adds a bonus token
    result = decode_lantern(
        target, target, COND[:1], SamplerConfig(temperature=1.0), torch.Generator().manual_seed(1), k=0,
        delta=0.0, neighbours=table(32, 1), draft_len=4,
    )  # fmt: skip
    stats = result.stats
    assert stats.tokens_rejected == 0 and stats.cycles == 36 // 5 + 1
    assert stats.tokens_accepted == 36 - stats.tokens_resampled and stats.tokens_resampled == stats.cycles - 1
    check_accounting(stats)


def test_delta_zero_first_token_follows_the_target_distribution():
    # Exact speculative sampling: the token's marginal is the target's p, not the drafter's q. A 1 x 1 grid
    # keeps it to the two `start`s per image: draft from q, accept with min(1, p/q), else resample.
    vocab, samples = 5, 1000
    target = tiny_gpt((1, 1), vocab, 4, dim=16, n_layer=1)
    drafter = tiny_gpt((1, 1), vocab, 5, dim=16, n_layer=1)
    for model, seed in ((target, 6), (drafter, 7)):  # sharper heads: distinct, far from uniform p and q
        torch.manual_seed(seed)
        torch.nn.init.normal_(model.output.weight, std=6.0)
    cond = torch.tensor([[1, 4, 7]]).expand(samples, -1)
    sampler = SamplerConfig(temperature=1.0)
    p = process_logits(target.start(cond[:1]).first_logits[0], sampler).double()
    q = process_logits(drafter.start(cond[:1]).first_logits[0], sampler).double()
    assert (p - q).abs().sum() > 0.3  # a drafter far enough from the target to matter
    result = decode_lantern(
        target, drafter, cond, sampler, torch.Generator().manual_seed(0), k=2, delta=0.0,
        neighbours=table(vocab, 2), draft_len=2,
    )  # fmt: skip
    counts = torch.bincount(result.tokens.flatten(), minlength=vocab).double()
    chi_square = ((counts - samples * p) ** 2 / (samples * p)).sum()
    assert chi_square < 18.5  # chi-square with 4 degrees of freedom: P(> 18.5) < 0.001
    assert ((counts - samples * q) ** 2 / (samples * q)).sum() > 100  # clearly not the drafter's q
    assert 0 < result.stats.tokens_rejected < samples


def test_positive_delta_accepts_more(target, drafter):
    sampler = SamplerConfig(temperature=1.0)
    accepted = []
    for delta in (0.0, 0.5):
        result = decode_lantern(
            target, drafter, COND, sampler, torch.Generator().manual_seed(4), k=16, delta=delta,
            neighbours=table(32, 16), draft_len=4,
        )  # fmt: skip
        check_accounting(result.stats)
        accepted.append(result.stats.tokens_accepted)
    assert accepted[1] > accepted[0]


@pytest.mark.parametrize(
    "change, message",
    [
        ({"delta": 1.5}, r"delta must lie in \[0, 1\]"),
        ({"draft_len": 0}, "draft_len must be >= 1"),
        ({"k": 9}, "exceeds the neighbour table's 8 columns"),
        ({"k": 32}, r"k must lie in \[0, 32\)"),
        ({"drafter": "small-grid"}, "LANTERN needs one grid"),
        ({"drafter": "other-vocab"}, "target and drafter vocabularies differ"),
    ],
)
def test_bad_knobs(target, drafter, change, message):
    knobs = dict(k=2, delta=0.1, neighbours=table(32, 8), draft_len=4)
    knobs.update({key: value for key, value in change.items() if key != "drafter"})
    other = {
        "small-grid": lambda: tiny_gpt((3, 3), 32, 1),
        "other-vocab": lambda: tiny_gpt((6, 6), 16, 1),
    }
    if "drafter" in change:
        drafter = other[change["drafter"]]()
    with pytest.raises(ValueError, match=message):
        decode_lantern(target, drafter, COND, GREEDY, torch.Generator(), **knobs)
