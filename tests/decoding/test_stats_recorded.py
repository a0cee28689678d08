"""The model wrappers (mulo_sd/decoding/methods/instrumented.py) record every model call into DecodeStats:
checked
against models that count their own calls, in every method."""

import pytest
import torch

from mulo_sd.decoding.methods import decode_ar, decode_eagle2, decode_lantern, decode_mulo, decode_zipar
from mulo_sd.decoding.methods.instrumented import DRAFT_HEAD, Recorded
from mulo_sd.decoding.sampling import SamplerConfig
from mulo_sd.decoding.stats import DecodeStats
from tests.decoding.test_eagle2 import tiny_head
from tests.decoding.test_mulo import H, RepeatUpsampler, StridedDownsampler, V, W
from tests.helpers import tiny_gpt

SAMPLED = SamplerConfig(temperature=1.0, cfg_scale=2.0)
COND = torch.tensor([[1, 4, 7], [2, 2, 9]])


class Counting:
    """A model that counts the calls of its `forwards` and the token ids fed to them (`step(state, tokens,
    ...)`), independently of DecodeStats; every other attribute is the model's."""

    def __init__(self, model, forwards=("start", "step", "step_tree")):  # the ids: step's second argument
        self.model, self.calls, self.tokens = model, 0, 0
        for name in forwards:
            if hasattr(model, name):
                setattr(self, name, self.counted(getattr(model, name), name))

    def counted(self, method, name):
        def call(*args, **kwargs):
            self.calls += 1
            self.tokens += args[1].numel() if name in ("step", "step_tree") else 0
            return method(*args, **kwargs)

        return call

    def __getattr__(self, name):
        return getattr(self.model, name)


class FakeModel:
    grid_size = (2, 3)

    def start(self, cond, cfg_scale):
        return "state"

    def step(self, state, tokens, positions):
        return tokens.float()

    def output(self, features):  # not a forward: passed through, never recorded
        return features


def test_wrapper_records_each_forward_with_the_tokens_fed():
    stats = DecodeStats(batch_size=2)
    model = Recorded(FakeModel(), "target", stats)
    assert model.start(torch.zeros(2, 3), 1.0) == "state" and model.grid_size == (2, 3)
    logits = model.step("state", torch.ones(2, 4, dtype=torch.long), positions=None)
    assert torch.equal(logits, torch.ones(2, 4))
    model.step("state", tokens=torch.ones(2, 1, dtype=torch.long), positions=None)  # by keyword too
    model.output(torch.zeros(1))
    assert (stats.target_forwards, stats.tokens_evaluated, stats.sequential_steps) == (3, 10, 3)
    head = Recorded(FakeModel(), "drafter", stats, DRAFT_HEAD)
    head.start(None, 1.0)  # a draft head's start allocates a cache, no forward
    head.step("state", torch.ones(1, 5), None)
    assert (stats.drafter_forwards, stats.tokens_evaluated, stats.sequential_steps) == (1, 10, 4)
    with pytest.raises(ValueError, match="unknown model role 'critic'"):
        Recorded(FakeModel(), "critic", stats).step("state", torch.ones(1, 1), None)


def check_recorded(stats, target, drafter=None, upsampler=None, downsampler=None):
    """The stats' call counts are the calls the models saw, and every call is one sequential step."""
    drafters = drafter.calls if drafter else 0
    ups, downs = (upsampler.calls if upsampler else 0), (downsampler.calls if downsampler else 0)
    assert stats.target_forwards == target.calls > 0 and stats.tokens_evaluated == target.tokens
    assert (stats.drafter_forwards, stats.upsampler_calls, stats.downsampler_calls) == (drafters, ups, downs)
    assert stats.sequential_steps == target.calls + drafters + ups + downs


@pytest.fixture(scope="module")
def target():
    return tiny_gpt((H, W), V, 0)


def test_ar_and_zipar_record_every_call(target):
    counted = Counting(target)
    check_recorded(decode_ar(counted, COND, SAMPLED, torch.Generator().manual_seed(0)).stats, counted)
    counted = Counting(target)
    result = decode_zipar(counted, COND, SAMPLED, torch.Generator().manual_seed(0), window=2)
    check_recorded(result.stats, counted)


def test_lantern_and_eagle2_record_every_call(target):
    drafter = Counting(tiny_gpt((H, W), V, 1))
    counted = Counting(target)
    neighbours = torch.arange(32)[:, None].repeat(1, 4)
    result = decode_lantern(
        counted, drafter, COND[:1], SAMPLED, torch.Generator().manual_seed(0), k=2, delta=0.2,
        neighbours=neighbours, draft_len=3,
    )  # fmt: skip
    check_recorded(result.stats, counted, drafter)
    head = Counting(tiny_head(target, 1), ("step",))
    counted = Counting(target)
    generator = torch.Generator().manual_seed(0)
    result = decode_eagle2(counted, head, COND[:1], SAMPLED, generator, depth=3, top_k=3, total_tokens=6)
    check_recorded(result.stats, counted, head)
    assert result.stats.cycles >= 2 and head.calls >= result.stats.cycles


@pytest.mark.parametrize(
    "knobs",
    [
        {"rejection": "local", "l": 1, "island_zipar_window": 2, "draft_window": 2, "rows_per_cycle": 2},
        {"rejection": "naive", "parallel": False, "refresh_after_resample": True, "rows_per_cycle": 1},
        {"rejection": "raster", "rows_per_cycle": 2, "tau": 0.005},
    ],
    ids=["local-zipar", "naive-serial-refresh", "raster"],
)
def test_mulo_records_every_call_of_its_four_models(target, knobs):
    drafter, counted = Counting(tiny_gpt((H // 2, W // 2), V, 1)), Counting(target)
    upsampler = Counting(RepeatUpsampler(2), ("upsample_rows",))
    downsampler = Counting(StridedDownsampler(2), ("downsample",))
    neighbours = torch.arange(32)[:, None].repeat(1, 4)
    result = decode_mulo(
        counted, drafter, upsampler, downsampler, COND[:1], SAMPLED, torch.Generator().manual_seed(0),
        k=2, neighbours=neighbours, **{"tau": 0.02, **knobs},
    )  # fmt: skip
    check_recorded(result.stats, counted, drafter, upsampler, downsampler)
    assert result.stats.cycles > 1 and downsampler.calls > 0
