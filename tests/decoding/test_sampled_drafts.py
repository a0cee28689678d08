"""Drafts sampled from the up-sampler (`draft_temperature` > 0): drawn from its softmax(logits / temperature)
with the decode's own generator, so seeded decodes repeat, batched images equal their solo decodes, and a
vanishing temperature gives back the argmax draft."""

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from mulo_sd.decoding.methods import decode_mulo
from mulo_sd.decoding.methods.mulo_checks import own_draft_temperature
from mulo_sd.decoding.sampling import SamplerConfig
from mulo_sd.nets.upsampler import Upsampler
from mulo_sd.pipeline.testbed_models import TESTBED_DIR
from tests.decoding.test_mulo import EXACT, GREEDY, H, RepeatUpsampler, StridedDownsampler, V, W
from tests.helpers import tiny_gpt

PLAIN = SamplerConfig(temperature=1.0, top_k=8)
COND = torch.tensor([[1, 4, 7], [2, 2, 9], [5, 3, 1]])
EVERYTHING = dict(tau=0.0, k=0)  # accept every draft: the decode's tokens are its drafts


class LogitUpsampler(RepeatUpsampler):
    """Stand-in learned up-sampler: the repeated low-res token gets a margin of 2 over fixed random logits, so
    its argmax is `RepeatUpsampler`'s draft and sampling at temperature 1 often draws other codes."""

    def __init__(self, r=2):
        super().__init__(r)
        self.noise = torch.randn(1, V, 64, 64, generator=torch.Generator().manual_seed(5))

    def upsample_rows_logits(self, ids_low, first_row):
        ids = self.upsample_rows(ids_low, first_row)
        logits = self.noise[:, :, : ids.shape[1], : ids.shape[2]].repeat(ids.shape[0], 1, 1, 1)
        logits.scatter_(1, ids[:, None], logits.amax(1, keepdim=True) + 2.0)
        return logits


@pytest.fixture(scope="module")
def models():
    return tiny_gpt((H, W), V, 0), tiny_gpt((H // 2, W // 2), V, 1)


def decode(models, cond, sampler, generator, temperature, upsampler=None, **knobs):
    target, drafter = models
    return decode_mulo(
        target, drafter, upsampler or LogitUpsampler(), StridedDownsampler(2), cond, sampler, generator,
        neighbours=torch.arange(V)[:, None], draft_temperature=temperature, **{**EVERYTHING, **knobs},
    )  # fmt: skip


def seeded(seed):
    return torch.Generator().manual_seed(seed)


def test_a_vanishing_temperature_gives_the_argmax_draft(models):
    # greedy target and drafter: the generator feeds only the draft's draws
    argmax = decode(models, COND[:1], GREEDY, seeded(0), 0.0, **EXACT)
    cold = decode(models, COND[:1], GREEDY, seeded(0), 1e-4, **EXACT)
    assert torch.equal(cold.tokens, argmax.tokens)
    assert cold.stats.upsampler_calls == argmax.stats.upsampler_calls >= 1


def test_sampled_drafts_differ_from_the_argmax_and_repeat_under_one_seed(models):
    argmax = decode(models, COND[:1], GREEDY, seeded(0), 0.0).tokens
    hot = decode(models, COND[:1], GREEDY, seeded(0), 1.0).tokens
    # every draft is kept (tau 0), so the share that is not the repeated low-res token is the sampled share
    changed = (hot != argmax).float().mean().item()
    assert 0.2 < changed < 0.95, changed
    assert torch.equal(decode(models, COND[:1], GREEDY, seeded(0), 1.0).tokens, hot)
    assert not torch.equal(decode(models, COND[:1], GREEDY, seeded(1), 1.0).tokens, hot)


def test_a_batch_with_sampled_drafts_equals_its_images_decoded_alone(models):
    knobs = dict(tau=0.01, k=1, l=1)  # rejections, islands: schedules that differ per image
    batch = decode(models, COND, PLAIN, [seeded(s) for s in (3, 4, 5)], 0.7, **knobs)
    for b, seed in enumerate((3, 4, 5)):
        alone = decode(models, COND[b : b + 1], PLAIN, seeded(seed), 0.7, **knobs)
        assert torch.equal(batch.tokens[b], alone.tokens[0]), f"image {b} differs from its decode alone"


@pytest.mark.parametrize(
    "temperature, upsampler, message",
    [
        (-0.5, None, r"draft_temperature must be >= 0 \(0: the up-sampler's argmax\), got -0.5"),
        (float("nan"), None, "draft_temperature must be >= 0"),
        (0.5, RepeatUpsampler(2), "RepeatUpsampler has none \\(the pixel path interpolates\\)"),
    ],
)
def test_bad_draft_temperatures(models, temperature, upsampler, message):
    with pytest.raises(ValueError, match=message):
        decode(models, COND[:1], GREEDY, seeded(0), temperature, upsampler)


def test_the_default_temperature_is_the_one_shipped_with_the_upsampler():
    shipped = Upsampler.from_pretrained(TESTBED_DIR / "ablation" / "upsampler_r4_caption")
    # chosen on dev prompts (conf/eval/draft_temperature.yaml)
    assert shipped.config.draft_temperature == 0.35
    assert own_draft_temperature(Upsampler.from_pretrained(TESTBED_DIR / "upsampler_r4")) == 0.0
    assert own_draft_temperature(LogitUpsampler()) == 0.0  # no config: the argmax
    with pytest.raises(ValueError, match="UpsamplerConfig.draft_temperature must be >= 0, got -1"):
        dataclasses.replace(shipped.config, draft_temperature=-1)


def test_an_unset_temperature_reads_the_upsamplers_config(models):
    upsampler = LogitUpsampler()
    upsampler.config = SimpleNamespace(draft_temperature=0.7)
    own = decode(models, COND[:1], GREEDY, seeded(0), None, upsampler)
    assert torch.equal(own.tokens, decode(models, COND[:1], GREEDY, seeded(0), 0.7).tokens)
    assert not torch.equal(own.tokens, decode(models, COND[:1], GREEDY, seeded(0), 0.0).tokens)
