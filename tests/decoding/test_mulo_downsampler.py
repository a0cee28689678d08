"""decode_mulo without a down-sampler: the modes that never call one decode the same tokens with
`downsampler=None`; the modes that do (rejection='raster', a rows_per_cycle) refuse it."""

import pytest
import torch

from mulo_sd.decoding.methods import decode_mulo
from mulo_sd.decoding.methods.mulo_checks import uses_downsampler
from mulo_sd.decoding.neighbours import codebook_neighbours
from mulo_sd.decoding.sampling import SamplerConfig
from tests.decoding.test_mulo import BATCH_COND, RepeatUpsampler, StridedDownsampler, V
from tests.helpers import tiny_gpt

SAMPLED = SamplerConfig(temperature=1.0, top_k=8)
LOOSE = dict(tau=0.3, k=2)  # sampled drafts against a random target: rejections in every image


@pytest.fixture(scope="module")
def models():
    codebook = torch.randn(V, 4, generator=torch.Generator().manual_seed(2))
    return tiny_gpt((8, 8), V, 0), tiny_gpt((4, 4), V, 1), codebook_neighbours(codebook, 8)


def run(models, downsampler, upsampler=None, **knobs):
    target, drafter, neighbours = models
    return decode_mulo(
        target, drafter, upsampler or RepeatUpsampler(2), downsampler, BATCH_COND, SAMPLED,
        torch.Generator().manual_seed(0), neighbours=neighbours, **{**LOOSE, **knobs},
    )  # fmt: skip


ONE_CYCLE = [{}, {"rejection": "naive"}, {"l": 1}, {"l": 2, "refresh_after_resample": True}]
PARTIAL = [{"rejection": "raster"}, {"rows_per_cycle": 1}, {"rows_per_cycle": 2, "l": 1}]


@pytest.mark.parametrize("knobs", ONE_CYCLE)
def test_one_cycle_modes_decode_the_same_tokens_without_a_downsampler(models, knobs):
    assert not uses_downsampler(knobs.get("rejection", "local"), None)
    given = run(models, StridedDownsampler(2), **knobs)
    alone = run(models, None, **knobs)
    assert torch.equal(given.tokens, alone.tokens) and alone.stats.tokens_rejected > 0
    assert given.stats.downsampler_calls == alone.stats.downsampler_calls == 0
    assert alone.stats.cycles == 2  # one per image


@pytest.mark.parametrize("knobs", PARTIAL)
def test_modes_that_draft_from_downsampled_rows_need_one(models, knobs):
    assert uses_downsampler(knobs.get("rejection", "local"), knobs.get("rows_per_cycle"))
    assert run(models, StridedDownsampler(2), **knobs).stats.downsampler_calls > 0
    with pytest.raises(ValueError, match=r"draft from down-sampled accepted rows: give a downsampler"):
        run(models, None, **knobs)


def test_the_scale_check_names_only_the_samplers_given(models):
    with pytest.raises(ValueError, match=r"^upsampler r=4 must equal the grid ratio r=2"):
        run(models, None, upsampler=RepeatUpsampler(4))
