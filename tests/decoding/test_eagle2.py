import itertools

import pytest
import torch
from scipy.stats import chisquare

from mulo_sd.decoding.methods import decode_ar, decode_eagle2
from mulo_sd.decoding.sampling import SamplerConfig, process_logits
from mulo_sd.nets.eagle_head import EagleHead, EagleHeadConfig
from mulo_sd.nets.guidance import guide
from tests.helpers import tiny_gpt

COND = torch.tensor([[1, 4, 7], [2, 2, 9]])
TREE = {"depth": 3, "top_k": 3, "total_tokens": 8}
CHAIN = {"depth": 3, "top_k": 1, "total_tokens": 3}


def tiny_head(target, seed):
    torch.manual_seed(seed)
    head = EagleHead(EagleHeadConfig.for_target(target.config)).eval()
    for parameter in head.parameters():
        torch.nn.init.normal_(parameter, std=0.2)
    return head.double()


@pytest.fixture(scope="module")
def models():
    target = tiny_gpt((5, 5), 6, 0)
    return target, tiny_head(target, 1)


def check_accounting(stats, size):
    assert stats.tokens_accepted + stats.tokens_resampled == size * stats.batch_size  # each position once
    assert stats.target_forwards == stats.batch_size + stats.cycles  # start + one verification per cycle
    assert stats.sequential_steps == stats.target_forwards + stats.drafter_forwards
    assert (
        sum(stats.accepted_per_cycle) == stats.tokens_accepted
        and len(stats.accepted_per_cycle) == stats.cycles
    )


@pytest.mark.parametrize("knobs", [TREE, CHAIN], ids=["tree", "chain"])
@pytest.mark.parametrize("cfg_scale", [1.0, 2.0])
def test_greedy_eagle2_equals_greedy_ar(models, knobs, cfg_scale):
    target, head = models
    greedy = SamplerConfig(temperature=0.0, cfg_scale=cfg_scale)
    expected = decode_ar(target, COND, greedy, torch.Generator().manual_seed(0)).tokens
    result = decode_eagle2(target, head, COND, greedy, torch.Generator().manual_seed(0), **knobs)
    assert torch.equal(result.tokens, expected)
    assert result.stats.tokens_accepted > 0 and result.stats.tokens_rejected > 0  # both paths were taken
    check_accounting(result.stats, 25)


def ar_joint(target, cond, sampler):
    """AR's exact distribution over every grid of a tiny model: sequences [V^N, N], probabilities [V^N]."""
    size, vocab = target.num_tokens, target.vocab_size
    grids = torch.tensor(list(itertools.product(range(vocab), repeat=size)))
    conds = cond.expand(len(grids), -1)
    with torch.no_grad():
        conditional = target(grids, conds, drop=torch.zeros(len(grids), dtype=torch.bool))
        unconditional = target(grids, conds, drop=torch.ones(len(grids), dtype=torch.bool))
    probs = process_logits(guide(conditional, unconditional, sampler.cfg_scale), sampler)
    return grids, probs.gather(2, grids[..., None])[..., 0].prod(1)


@pytest.mark.parametrize("knobs", [TREE, CHAIN], ids=["tree", "chain"])
@pytest.mark.parametrize("sampler", [SamplerConfig(1.0, cfg_scale=2.0), SamplerConfig(0.8, top_k=2)])
def test_sampled_joint_matches_enumerated_ar(knobs, sampler):
    # A 1 x 3 grid over 4 codes: 64 outcomes, each grid's probability enumerated exactly from the target.
    target = tiny_gpt((1, 3), 4, 3, head_std=0.08)
    head = tiny_head(target, 4)
    grids, expected = ar_joint(target, COND[:1], sampler)
    samples = 1200
    result = decode_eagle2(
        target, head, COND[:1].expand(samples, -1), sampler, torch.Generator().manual_seed(0), **knobs
    )
    place = 4 ** torch.arange(2, -1, -1)
    codes = result.tokens.flatten(1) @ place
    observed = torch.bincount(codes, minlength=len(grids)).double()
    assert torch.equal(grids @ place, torch.arange(len(grids)))
    support = expected > 0
    assert observed[~support].sum() == 0  # nothing outside the target's support (top-k zeros)
    expected = expected.double()
    expected = expected / expected.sum() * samples
    rare = support & (expected < 5)  # pooled into one cell: chi-square needs expected counts of about 5
    common = support & ~rare
    assert common.sum() >= 6
    pooled = [common, rare] if rare.any() else [common]
    observed = torch.cat([observed[common], observed[rare].sum()[None]][: len(pooled)])
    expected = torch.cat([expected[common], expected[rare].sum()[None]][: len(pooled)])
    statistic = chisquare(observed.numpy(), expected.numpy())
    assert statistic.pvalue > 1e-3, statistic
    stats = result.stats
    assert stats.tokens_accepted > samples // 10 and stats.tokens_rejected > 0
    check_accounting(stats, 3)


def test_tree_step_gives_the_logits_of_each_branch_decoded_alone():
    target = tiny_gpt((4, 4), 8, 5)
    state = target.start(COND[:1], 2.0)
    prefix = torch.tensor([[3, 1, 4]])
    target.step(state, prefix, torch.arange(3))
    # root at position 2 (its token rewritten), two children, one grandchild under each child, one extra leaf
    tokens = torch.tensor([[4, 5, 6, 7, 2, 0]])
    parents = torch.tensor([-1, 0, 0, 1, 2, 1])
    positions = torch.tensor([2, 3, 3, 4, 4, 4])
    state.add_tree_slots(8)
    logits, hidden = target.step_tree(state, tokens, positions, parents)
    assert hidden.shape == (2, 6, 32)  # both guidance rows
    for leaf in (3, 4, 5):
        path = [leaf]
        while parents[path[0]] >= 0:
            path.insert(0, int(parents[path[0]]))
        branch = target.start(COND[:1], 2.0)
        target.step(branch, prefix[:, :2], torch.arange(2))
        alone = target.step(branch, tokens[:, path], positions[path])
        torch.testing.assert_close(logits[:, path], alone, rtol=1e-9, atol=1e-9)
    # committing a path equals having decoded it: the next step's logits agree
    state.commit_tree(torch.tensor([0, 2, 4]), positions[[0, 2, 4]] + state.cond_len)
    reference = target.start(COND[:1], 2.0)
    target.step(reference, torch.tensor([[3, 1, 4, 6, 2]]), torch.arange(5))
    next_token = torch.tensor([[1]])
    torch.testing.assert_close(
        target.step(state, next_token, torch.tensor([5])),
        target.step(reference, next_token, torch.tensor([5])),
    )


@pytest.mark.parametrize(
    "knobs, message",
    [
        ({"depth": 0, "top_k": 2, "total_tokens": 2}, "depth must be >= 1"),
        ({"depth": 2, "top_k": 0, "total_tokens": 2}, "top_k must lie in"),
        ({"depth": 2, "top_k": 7, "total_tokens": 2}, "top_k must lie in"),
        ({"depth": 2, "top_k": 2, "total_tokens": 0}, "total_tokens must lie in"),
        ({"depth": 2, "top_k": 2, "total_tokens": 7}, r"total_tokens must lie in \[1, 6\]"),
    ],
)
def test_bad_knobs_are_clear_errors(models, knobs, message):
    target, head = models
    with pytest.raises(ValueError, match=message):
        decode_eagle2(target, head, COND, SamplerConfig(), torch.Generator(), **knobs)


def test_head_of_another_target_and_bad_trees_are_errors(models):
    target, head = models
    other = tiny_gpt((4, 4), 6, 0)
    with pytest.raises(ValueError, match="trained for a target with"):
        decode_eagle2(other, head, COND, SamplerConfig(), torch.Generator(), **TREE)
    state = target.start(COND[:1])
    state.add_tree_slots(4)
    with pytest.raises(ValueError, match="a child is one position after its parent"):
        target.step_tree(state, torch.tensor([[1, 2]]), torch.tensor([3, 3]), torch.tensor([-1, 0]))
    with pytest.raises(ValueError, match="a parent must come before its child"):
        target.step_tree(state, torch.tensor([[1, 2]]), torch.tensor([3, 4]), torch.tensor([1, -1]))
    with pytest.raises(ValueError, match="tree slots"):
        target.step_tree(state, torch.ones(1, 5, dtype=torch.long), torch.arange(5), torch.arange(-1, 4))
