import pytest
import torch

import mulo_sd.decoding.methods.mulo as mulo_module
from mulo_sd.decoding.methods import decode_ar, decode_mulo, decode_zipar
from mulo_sd.decoding.neighbours import codebook_neighbours
from mulo_sd.decoding.sampling import SamplerConfig
from tests.helpers import tiny_gpt

V = 32
H, W = 8, 8  # target grid; the drafter's is 4 x 4 (r = 2)
GREEDY = SamplerConfig(temperature=0.0)
EXACT = dict(tau=1.0, k=0)  # with greedy sampling: accept iff the draft is the target's argmax


class RepeatUpsampler:
    """Stand-in U_r: every low-res token becomes an r x r block (row-causal)."""

    def __init__(self, r, codebook_size=V):
        self.r, self.codebook_size = r, codebook_size

    def upsample(self, ids):
        return ids.repeat_interleave(self.r, 1).repeat_interleave(self.r, 2)

    def upsample_rows(self, ids_low, first_row):
        return self.upsample(ids_low)[:, self.r * first_row :]


class StridedDownsampler:
    """Stand-in D_r: the top-left token of every r x r block."""

    def __init__(self, r, codebook_size=V):
        self.r, self.codebook_size = r, codebook_size

    def downsample(self, ids_high):
        return ids_high[:, :: self.r, :: self.r]


class OracleUpsampler(RepeatUpsampler):
    """Ignores the drafter: proposes the given high-res tokens, the ids at `corrupt` (raster) shifted by 1."""

    def __init__(self, reference, corrupt, r=2):
        super().__init__(r)
        self.draft = reference.clone().flatten()
        self.draft[corrupt] = (self.draft[corrupt] + 1) % V
        self.draft = self.draft.view(reference.shape)

    def upsample_rows(self, ids_low, first_row):
        return self.draft[None, self.r * first_row : self.r * ids_low.shape[1]]


@pytest.fixture(scope="module")
def target():
    return tiny_gpt((H, W), V, 0)


@pytest.fixture(scope="module")
def drafter():
    return tiny_gpt((H // 2, W // 2), V, 1)


@pytest.fixture(scope="module")
def neighbours():
    codebook = torch.nn.functional.normalize(
        torch.randn(V, 4, generator=torch.Generator().manual_seed(2)), dim=-1
    )
    return codebook_neighbours(codebook, 8)


COND = torch.tensor([[1, 4, 7]])
BATCH_COND = torch.tensor([[1, 4, 7], [2, 2, 9]])


@pytest.fixture(scope="module")
def reference(target):
    """Greedy AR tokens of the single-image condition, [H, W]."""
    return decode_ar(target, COND, GREEDY, torch.Generator().manual_seed(0)).tokens[0]


def run(target, drafter, neighbours, cond=COND, sampler=GREEDY, upsampler=None, seed=0, **knobs):
    knobs = {**EXACT, **knobs}
    upsampler = upsampler or RepeatUpsampler(2)
    return decode_mulo(
        target, drafter, upsampler, StridedDownsampler(2), cond, sampler, torch.Generator().manual_seed(seed),
        neighbours=neighbours, **knobs,
    )  # fmt: skip


def check_accounting(stats, size=H * W):
    """Counters that must add up in every mode."""
    assert stats.tokens_accepted + stats.tokens_resampled == size * stats.batch_size  # each position once
    assert stats.tokens_resampled == sum(stats.island_sizes)
    assert len(stats.islands_per_cycle) == stats.cycles and sum(stats.islands_per_cycle) == len(
        stats.island_sizes
    )
    assert stats.tokens_drafted >= stats.tokens_accepted + stats.tokens_rejected
    calls = stats.target_forwards + stats.drafter_forwards + stats.upsampler_calls + stats.downsampler_calls
    assert stats.sequential_steps == calls  # every call of this implementation is on the critical path
    if stats.per_image:  # a batch decoded together: per image as alone, the batch's calls shared
        for image in stats.per_image:
            check_accounting(image, size)
        assert stats.sequential_steps <= sum(image.sequential_steps for image in stats.per_image)
        assert stats.sequential_steps >= max(image.sequential_steps for image in stats.per_image)
        return
    assert stats.upsampler_calls == stats.cycles
    assert stats.downsampler_calls <= stats.cycles - stats.batch_size  # none after an image's last cycle
    assert {"prefill", "draft", "upsample", "verify"} <= set(stats.phase_seconds)


@pytest.mark.parametrize(
    "knobs",
    [{}, {"rows_per_cycle": 1}, {"draft_window": 2, "rows_per_cycle": 3}, {"accept_rule": "typical"}],
    ids=["all-rows", "one-row-per-cycle", "zipar-drafting", "typical-rule"],
)
def test_greedy_raster_equals_greedy_ar(target, drafter, neighbours, knobs):
    expected = decode_ar(target, BATCH_COND, GREEDY, torch.Generator().manual_seed(0)).tokens
    result = run(
        target, drafter, neighbours, cond=BATCH_COND, rejection="raster", refresh_after_resample=True, **knobs
    )
    assert torch.equal(result.tokens, expected)
    assert result.stats.batch_size == 2 and result.stats.tokens_resampled > 0
    check_accounting(result.stats)
    assert (
        result.stats.tokens_drafted > result.stats.tokens_accepted + result.stats.tokens_rejected
    )  # discarded


def test_greedy_raster_keeps_accepted_prefixes(target, drafter, neighbours, reference):
    # drafts equal to AR but for 3 positions: 4 cycles (3 rejections), each re-drafting a partial row group
    upsampler = OracleUpsampler(reference, [10, 37, 62])
    result = run(target, drafter, neighbours, upsampler=upsampler, rejection="raster")
    assert torch.equal(result.tokens[0], reference)
    stats = result.stats
    assert stats.cycles == 4 and stats.tokens_rejected == 3 and stats.tokens_resampled == 3
    assert stats.target_forwards == 1 + stats.cycles  # start + one verification per cycle, nothing else
    # committed 11, 38, 63 positions = 1, 4, 7 complete high-res rows = 0, 2, 3 complete low-res rows
    assert stats.downsampler_calls == 2
    check_accounting(stats)


@pytest.mark.parametrize(
    "knobs",
    [
        {"rejection": "local", "l": max(H, W)},
        {"rejection": "local", "l": max(H, W), "parallel": False, "refresh_after_resample": True},
        {"rejection": "local", "l": max(H, W), "island_zipar_window": W, "rows_per_cycle": 1},
    ],
    ids=["serial", "sequential-islands-refresh", "zipar-window-w-per-row"],
)
def test_greedy_local_equals_ar_when_islands_cover_the_tail(target, drafter, neighbours, reference, knobs):
    # R_X is then every position from t0 on: the resampling is plain AR decoding of the cycle's tail
    result = run(target, drafter, neighbours, **knobs)
    assert torch.equal(result.tokens[0], reference)
    assert result.stats.tokens_resampled > 0
    check_accounting(result.stats)


@pytest.mark.parametrize("rejection, l", [("local", 1), ("naive", 0)])
def test_greedy_local_is_exact_up_to_the_first_rejection(
    target, drafter, neighbours, reference, rejection, l
):
    # Kept tokens after an island were judged with the rejected drafts in their context, so local rejection
    # is not exact AR in general (even with refresh_after_resample); everything up to t0 is.
    t0 = 9
    upsampler = OracleUpsampler(reference, [t0, 30, 52])
    result = run(target, drafter, neighbours, upsampler=upsampler, rejection=rejection, l=l,
                 refresh_after_resample=True)  # fmt: skip
    flat = result.tokens[0].flatten()
    assert torch.equal(flat[: t0 + 1], reference.flatten()[: t0 + 1])
    check_accounting(result.stats)
    assert result.stats.tokens_drafted == result.stats.tokens_accepted + result.stats.tokens_resampled


def test_kept_positions_are_drafts_and_islands_resampled_once(
    target, drafter, neighbours, reference, monkeypatch
):
    found = []

    def record(mask):
        islands = mulo_module.find_islands.__wrapped__(mask)
        found.append(islands)
        return islands

    record.__wrapped__ = mulo_module.find_islands
    monkeypatch.setattr(mulo_module, "find_islands", record)
    upsampler = OracleUpsampler(reference, [9, 30, 52])
    result = run(target, drafter, neighbours, upsampler=upsampler, rejection="naive", rows_per_cycle=1)
    resampled = [p for islands in found for island in islands for row in island for p in row]
    assert len(resampled) == len(set(resampled)) == result.stats.tokens_resampled > 0
    kept = torch.ones(H * W, dtype=torch.bool)
    kept[resampled] = False
    assert torch.equal(result.tokens[0].flatten()[kept], upsampler.draft.flatten()[kept])


@pytest.mark.parametrize(
    "sampler, tau", [(GREEDY, 1.0), (SamplerConfig(temperature=1.0), 0.3)], ids=["greedy", "sampled"]
)
def test_parallel_islands_match_sequential_islands_with_fewer_steps(
    target, drafter, neighbours, reference, sampler, tau
):
    upsampler = OracleUpsampler(reference, [9, 30, 52])
    common = dict(upsampler=upsampler, rejection="naive", sampler=sampler, tau=tau, seed=3)
    batched = run(target, drafter, neighbours, **common)
    one_by_one = run(target, drafter, neighbours, parallel=False, **common)
    assert max(batched.stats.islands_per_cycle) >= 3
    assert torch.equal(batched.tokens, one_by_one.tokens)
    assert batched.stats.island_sizes == one_by_one.stats.island_sizes
    # one batched call per island step: the longest island decides (its first token comes from the verify)
    assert batched.stats.target_forwards == 1 + 1 + max(batched.stats.island_sizes) - 1
    island_steps = sum(size - 1 for size in one_by_one.stats.island_sizes)
    assert one_by_one.stats.target_forwards - 2 >= island_steps > max(batched.stats.island_sizes) - 1
    assert one_by_one.stats.sequential_steps > batched.stats.sequential_steps
    for result in (batched, one_by_one):
        check_accounting(result.stats)


def test_island_zipar_window_fills_rows_concurrently(target, drafter, neighbours, reference):
    upsampler = OracleUpsampler(reference, [9, 30, 52])
    serial = run(target, drafter, neighbours, upsampler=upsampler, rejection="local", l=1)
    zipar = run(
        target, drafter, neighbours, upsampler=upsampler, rejection="local", l=1, island_zipar_window=2
    )
    assert serial.stats.island_sizes == zipar.stats.island_sizes  # same verification, same islands
    assert zipar.stats.target_forwards < serial.stats.target_forwards
    check_accounting(zipar.stats)


def test_refresh_costs_one_forward_per_resampling_cycle(target, drafter, neighbours, reference):
    upsampler = OracleUpsampler(reference, [9, 30, 52])
    plain = run(target, drafter, neighbours, upsampler=upsampler, rejection="naive", rows_per_cycle=2)
    refreshed = run(target, drafter, neighbours, upsampler=upsampler, rejection="naive", rows_per_cycle=2,
                    refresh_after_resample=True)  # fmt: skip
    cycles_with_islands = sum(n > 0 for n in refreshed.stats.islands_per_cycle)
    assert cycles_with_islands >= 2
    if refreshed.stats.island_sizes == plain.stats.island_sizes:  # same islands: exactly one more per cycle
        assert refreshed.stats.target_forwards == plain.stats.target_forwards + cycles_with_islands
    assert "refresh" in refreshed.stats.phase_seconds


@pytest.mark.parametrize("rejection", ["local", "naive", "raster"])
def test_tau_zero_accepts_every_draft(target, drafter, neighbours, rejection):
    result = run(target, drafter, neighbours, tau=0.0, rejection=rejection, rows_per_cycle=1)
    stats = result.stats
    assert stats.tokens_resampled == stats.tokens_rejected == 0 and stats.tokens_accepted == H * W
    assert (
        stats.cycles == H // 2 and stats.target_forwards == 1 + stats.cycles
    )  # start + one verify per cycle
    assert stats.islands_per_cycle == [0] * stats.cycles
    # everything accepted: the output is the up-sampled greedy drafter (its rows never change when
    # down-sampled again), i.e. plain AR decoding of the drafter
    drafter_ar = decode_ar(drafter, COND, GREEDY, torch.Generator().manual_seed(0)).tokens
    assert torch.equal(result.tokens, RepeatUpsampler(2).upsample(drafter_ar))
    check_accounting(stats)


def test_zipar_drafting_follows_the_zipar_schedule(target, drafter, neighbours):
    # tau = 0, one cycle: MuLo-SD's draft is ZipAR decoding of the drafter, draw for draw
    sampler = SamplerConfig(temperature=1.0)
    result = run(target, drafter, neighbours, sampler=sampler, tau=0.0, draft_window=2, seed=5)
    zipar = decode_zipar(drafter, COND, sampler, torch.Generator().manual_seed(5), window=2)
    assert torch.equal(result.tokens, RepeatUpsampler(2).upsample(zipar.tokens))
    assert result.stats.drafter_forwards == zipar.stats.target_forwards  # start + ZipAR calls


def test_drafter_guidance_scale_drives_the_drafter_only(target, drafter, neighbours):
    # tau = 0, one cycle: the draft is AR decoding of the drafter, under its own guidance scale when given
    sampler = SamplerConfig(temperature=1.0, cfg_scale=2.0)
    guided = run(target, drafter, neighbours, sampler=sampler, tau=0.0, drafter_cfg_scale=5.0, seed=5)
    drafter_ar = decode_ar(
        drafter, COND, SamplerConfig(temperature=1.0, cfg_scale=5.0), torch.Generator().manual_seed(5)
    )
    assert torch.equal(guided.tokens, RepeatUpsampler(2).upsample(drafter_ar.tokens))
    plain = run(target, drafter, neighbours, sampler=sampler, tau=0.0, seed=5)
    assert not torch.equal(guided.tokens, plain.tokens)
    same = run(target, drafter, neighbours, sampler=sampler, tau=0.0, drafter_cfg_scale=2.0, seed=5)
    assert torch.equal(same.tokens, plain.tokens)  # the target's scale given explicitly: nothing changes


def test_typical_rule_rejects_fewer_than_the_absolute_rule(target, drafter, neighbours):
    # one cycle (naive local rejection), same seed: the same draft and verification; the typical bar
    # tau * exp(-H) is never above tau, so it rejects no more, and on these flat tiny-model distributions
    # strictly fewer
    sampler = SamplerConfig(temperature=1.0)
    knobs = dict(sampler=sampler, tau=0.1, k=2, rejection="naive", seed=3)
    absolute = run(target, drafter, neighbours, **knobs).stats
    typical = run(target, drafter, neighbours, accept_rule="typical", **knobs).stats
    assert absolute.cycles == typical.cycles == 1
    assert absolute.tokens_drafted == typical.tokens_drafted
    assert 0 <= typical.tokens_rejected < absolute.tokens_rejected


def test_changed_low_res_rows_are_rewritten_in_the_drafter(target, drafter, neighbours, reference):
    # The oracle's drafts ignore the drafter, so a committed row group down-samples to a low-res row that
    # differs from what the drafter drafted: the next draft call rewrites that whole row (no extra call).
    calls = []

    class Recorder:
        grid_size, vocab_size = drafter.grid_size, drafter.vocab_size

        def start(self, *args, **kwargs):
            return drafter.start(*args, **kwargs)

        def step(self, state, tokens, positions):
            calls.append((positions.tolist(), tokens[0].tolist()))
            return drafter.step(state, tokens, positions)

    result = decode_mulo(
        target, Recorder(), OracleUpsampler(reference, []), StridedDownsampler(2), COND, GREEDY,
        torch.Generator().manual_seed(0), neighbours=neighbours, rows_per_cycle=1, **EXACT,
    )  # fmt: skip
    assert torch.equal(result.tokens[0], reference)
    assert (
        result.stats.drafter_forwards == 1 + len(calls) == 1 + 4 * 4 - 1
    )  # one call per token but the first
    low = reference[::2, ::2]
    rewritten = 0
    for row in range(1, 4):  # the first call of the cycle drafting low-res row `row`
        positions, tokens = calls[3 + 4 * (row - 1)]
        assert positions[-1] == 4 * row - 1 and tokens[-1] == low[row - 1, -1]  # the query: last prefix token
        if len(positions) > 1:
            assert positions == list(range(4 * (row - 1), 4 * row)) and tokens == low[row - 1].tolist()
            rewritten += 1
    assert rewritten >= 1


@pytest.mark.parametrize(
    "change, message",
    [
        ({"tau": 1.5}, r"tau must lie in \[0, 1\]"),
        ({"tau": -0.1}, r"tau must lie in \[0, 1\]"),
        ({"k": -1}, r"k must lie in \[0, 32\)"),
        ({"k": V}, r"k must lie in \[0, 32\)"),
        ({"k": 9}, "exceeds the neighbour table's 8 columns"),
        ({"l": -1}, "l must be >= 0"),
        ({"rejection": "tail"}, "rejection must be one of"),
        ({"accept_rule": "relative"}, "accept_rule must be one of"),
        ({"rows_per_cycle": 0}, "rows_per_cycle must be None or >= 1"),
        ({"draft_window": 0}, "draft_window must be None or >= 1"),
        ({"island_zipar_window": 0}, "island_zipar_window must be None or >= 1"),
        (
            {"upsampler": RepeatUpsampler(4)},
            "upsampler r=4 and downsampler r=2 must equal the grid ratio r=2",
        ),
        ({"downsampler": StridedDownsampler(2, codebook_size=64)}, "must share one vocabulary"),
        ({"drafter": "wide"}, "must be the drafter grid 4x3 scaled by one integer r"),
    ],
)
def test_bad_knobs(target, drafter, neighbours, change, message):
    arguments = dict(upsampler=RepeatUpsampler(2), downsampler=StridedDownsampler(2), drafter=drafter)
    knobs = {**EXACT, "neighbours": neighbours}
    for key, value in change.items():
        (arguments if key in arguments else knobs)[key] = value
    if arguments["drafter"] == "wide":
        arguments["drafter"] = tiny_gpt((4, 3), V, 1)
    with pytest.raises(ValueError, match=message):
        decode_mulo(
            target, arguments["drafter"], arguments["upsampler"], arguments["downsampler"], COND, GREEDY,
            torch.Generator(), **knobs,
        )  # fmt: skip


def test_guidance_and_sampling_run(target, drafter, neighbours):
    sampler = SamplerConfig(temperature=1.0, top_k=8, cfg_scale=2.0)
    result = run(target, drafter, neighbours, cond=BATCH_COND, sampler=sampler, tau=0.05, k=4, draft_window=2)
    assert result.tokens.shape == (2, H, W) and result.tokens.dtype == torch.long
    assert 0 <= result.tokens.min() and result.tokens.max() < V
    check_accounting(result.stats)
    again = run(target, drafter, neighbours, cond=BATCH_COND, sampler=sampler, tau=0.05, k=4, draft_window=2)
    assert torch.equal(result.tokens, again.tokens)  # the generator is the only source of randomness
