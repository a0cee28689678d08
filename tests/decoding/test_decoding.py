import types
from collections import Counter

import pytest
import torch

import mulo_sd.decoding.methods.zipar as zipar_module
from mulo_sd.decoding.methods import decode_ar, decode_zipar, zipar_target_forwards
from mulo_sd.decoding.sampling import SamplerConfig
from mulo_sd.decoding.stats import DecodeStats
from mulo_sd.nets.gpt import GPT
from mulo_sd.nets.gpt_config import GPTConfig
from mulo_sd.nets.guidance import guide

H, W = 4, 6
GREEDY = SamplerConfig(temperature=0.0)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    config = GPTConfig(
        vocab_size=32, grid_size=(H, W), dim=32, n_layer=2, n_head=4, cond_type="words", cond_len=3,
        cond_vocab_size=10, caption_dim=16, multiple_of=16,
    )  # fmt: skip
    gpt = GPT(config).eval()
    torch.nn.init.normal_(gpt.output.weight, std=1.0)  # the LlamaGen init zeroes the head: all logits equal
    return gpt


@pytest.fixture(scope="module")
def cond():
    return torch.tensor([[1, 4, 7], [2, 2, 9]])


class Recorder:
    """Passes calls through to the model and records what every `step` fed."""

    def __init__(self, model):
        self.model, self.grid_size, self.steps = model, model.grid_size, []

    def start(self, *args, **kwargs):
        return self.model.start(*args, **kwargs)

    def step(self, state, tokens, positions):
        self.steps.append((tokens.clone(), positions.tolist()))
        return self.model.step(state, tokens, positions)


@torch.inference_mode()
def greedy_by_full_forwards(model, cond, cfg_scale=1.0):
    """Oracle without any cache: a teacher-forced forward over the whole prefix for every token."""
    batch = cond.shape[0]
    tokens = torch.zeros(batch, 1, dtype=torch.long)
    for t in range(H * W):
        logits = model(tokens, cond, drop=torch.zeros(batch, dtype=torch.bool))[:, t]
        if cfg_scale != 1.0:
            uncond = model(tokens, cond, drop=torch.ones(batch, dtype=torch.bool))[:, t]
            logits = guide(logits, uncond, cfg_scale)
        tokens[:, t] = logits.argmax(-1)
        tokens = torch.cat([tokens, torch.zeros(batch, 1, dtype=torch.long)], dim=1)
    return tokens[:, :-1].view(batch, H, W)


@pytest.mark.parametrize("cfg_scale", [1.0, 3.0])
def test_greedy_ar_equals_full_forward_oracle(model, cond, cfg_scale):
    sampler = SamplerConfig(temperature=0.0, cfg_scale=cfg_scale)
    result = decode_ar(model, cond, sampler, torch.Generator().manual_seed(0))
    assert result.tokens.shape == (2, H, W) and result.tokens.dtype == torch.long
    assert len(result.tokens.unique()) > 3  # the model is not degenerate
    assert torch.equal(result.tokens, greedy_by_full_forwards(model, cond, cfg_scale))
    assert result.image is None


def test_ar_stats(model, cond):
    stats = decode_ar(model, cond, GREEDY, torch.Generator().manual_seed(0)).stats
    assert stats.batch_size == 2
    assert stats.target_forwards == stats.sequential_steps == H * W
    assert stats.tokens_evaluated == 2 * (H * W - 1)
    assert stats.drafter_forwards == stats.tokens_drafted == stats.cycles == 0
    assert set(stats.phase_seconds) == {"prefill", "decode"}
    assert stats.wall_seconds >= sum(stats.phase_seconds.values()) > 0


def test_sampling_follows_the_generator(model, cond):
    sampler = SamplerConfig(temperature=1.0, top_k=20, top_p=0.95, cfg_scale=2.0)
    for decode, kwargs in ((decode_ar, {}), (decode_zipar, {"window": 2})):
        first = decode(model, cond, sampler, torch.Generator().manual_seed(1), **kwargs).tokens
        again = decode(model, cond, sampler, torch.Generator().manual_seed(1), **kwargs).tokens
        other = decode(model, cond, sampler, torch.Generator().manual_seed(2), **kwargs).tokens
        assert torch.equal(first, again)
        assert not torch.equal(first, other)


@pytest.mark.parametrize("window", [W, W + 3])
def test_zipar_with_full_rows_equals_ar(model, cond, window):
    ar = decode_ar(model, cond, GREEDY, torch.Generator().manual_seed(0))
    zipar = decode_zipar(model, cond, GREEDY, torch.Generator().manual_seed(0), window=window)
    assert torch.equal(zipar.tokens, ar.tokens)
    assert zipar.stats.target_forwards == zipar_target_forwards((H, W), window) == H * W
    assert zipar.stats.tokens_evaluated == ar.stats.tokens_evaluated


@pytest.mark.parametrize("window", [1, 2, 4])
def test_zipar_schedule_with_a_small_window(model, cond, window, monkeypatch):
    sampled = []
    real_sample = zipar_module.sample
    monkeypatch.setattr(
        zipar_module,
        "sample",
        lambda probs, gen: sampled.append(probs[..., 0].numel()) or real_sample(probs, gen),
    )
    recorder = Recorder(model)
    result = decode_zipar(recorder, cond, GREEDY, torch.Generator().manual_seed(0), window=window)
    stats = result.stats

    expected_forwards = W + (H - 1) * window
    assert stats.target_forwards == stats.sequential_steps == expected_forwards
    assert zipar_target_forwards((H, W), window) == expected_forwards
    assert len(recorder.steps) == expected_forwards - 1  # `start` is the first call

    # every grid position is sampled exactly once
    assert sum(sampled) == 2 * H * W
    assert (result.tokens >= 0).all()

    # every position but the last is fed at its own slot; each row end but the last also gets a stand-in
    fed = Counter(p for _, positions in recorder.steps for p in positions)
    stand_ins = {(r + 1) * W - 1 for r in range(H - 1)}
    assert fed == Counter({p: 2 if p in stand_ins else 1 for p in range(H * W - 1)})
    assert stats.tokens_evaluated == 2 * (H * W - 1 + H - 1)
    # at most one token per active row, plus one stand-in or completed row end
    assert max(len(positions) for _, positions in recorder.steps) <= -(-W // window) + 1

    # the last write of each slot is the token in the output, so the cache matches the image
    last_write = {}
    for tokens, positions in recorder.steps:
        for i, p in enumerate(positions):
            last_write[p] = tokens[:, i]
    flat = result.tokens.view(2, H * W)
    for p, value in last_write.items():
        assert torch.equal(value, flat[:, p])

    # row 0 never sees a stand-in (they sit at later slots), so it matches plain AR
    ar = decode_ar(model, cond, GREEDY, torch.Generator().manual_seed(0))
    assert torch.equal(result.tokens[:, 0], ar.tokens[:, 0])


def test_zipar_rejects_a_bad_window(model, cond):
    with pytest.raises(ValueError, match="ZipAR window must be >= 1 token, got 0"):
        decode_zipar(model, cond, GREEDY, torch.Generator(), window=0)


def test_tokenizer_decodes_the_image(model, cond):
    tokenizer = types.SimpleNamespace(decode=lambda ids: ids.float().unsqueeze(1).repeat(1, 3, 2, 2))
    result = decode_zipar(
        model, cond, GREEDY, torch.Generator().manual_seed(0), window=2, tokenizer=tokenizer
    )
    assert torch.equal(result.image, tokenizer.decode(result.tokens))
    assert "image" in result.stats.phase_seconds


def test_stats_add_and_flat_row():
    first = DecodeStats(batch_size=1, target_forwards=5, sequential_steps=5, tokens_evaluated=4, cycles=1)
    first.islands_per_cycle.append(2)
    first.island_sizes.extend([3, 1])
    with first.phase("verify"):
        pass
    second = DecodeStats(batch_size=2, target_forwards=3, tokens_accepted=7, cycles=2, wall_seconds=0.5)
    second.islands_per_cycle.extend([1, 0])
    second.island_sizes.append(5)
    second.phase_seconds["verify"] = 0.25

    merged = first.add(second)
    assert merged is first
    assert (merged.batch_size, merged.target_forwards, merged.tokens_accepted, merged.cycles) == (3, 8, 7, 3)
    assert merged.islands_per_cycle == [2, 1, 0] and merged.island_sizes == [3, 1, 5]
    assert merged.phase_seconds["verify"] >= 0.25

    row = merged.as_dict()
    assert all(isinstance(v, (int, float, str)) for v in row.values())
    assert row["islands"] == 3 and row["island_size_max"] == 5 and row["island_size_mean"] == 3.0
    assert row["islands_per_cycle"] == "2 1 0"
    assert row["time_verify_s"] == merged.phase_seconds["verify"] and row["wall_s"] == 0.5
    assert row["target_forwards"] == 8 and "device" not in row
    assert row["accepted_per_cycle_mean"] == ""  # no draft-tree cycles: not a mean of 0 kept drafts
    merged.accepted_per_cycle.extend([2, 3])
    assert merged.as_dict()["accepted_per_cycle_mean"] == 2.5
