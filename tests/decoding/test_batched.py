"""Batch equals single: every method decodes image b of a batch to exactly the tokens it gives decoding that
image alone under the same per-image generator (docs/batching.md), for prompts whose schedules differ
(cycles, islands, accept lengths), with guidance (internal rows doubled) and without."""

import pytest
import torch

from mulo_sd.decoding.sampling import SamplerConfig
from mulo_sd.decoding.stats import COUNTS
from tests.decoding.dispatch import decode_method
from tests.decoding.test_eagle2 import tiny_head
from tests.decoding.test_mulo import H, V, W
from tests.helpers import tiny_gpt

GUIDED = SamplerConfig(temperature=1.0, cfg_scale=2.0)
PLAIN = SamplerConfig(temperature=1.0, top_k=8)
PROMPTS = torch.tensor([[1, 4, 7], [2, 2, 9], [5, 3, 1], [8, 0, 6]])
SEEDS = [11, 12, 13, 14]
NEIGHBOURS = torch.arange(V)[:, None].repeat(1, 4)
MULO = {
    "mulo-local": {"rejection": "local", "l": 1, "tau": 0.0001, "k": 2},
    "mulo-local-zipar": {
        "rejection": "local", "l": 1, "island_zipar_window": 2, "draft_window": 2, "tau": 0.0001, "k": 2,
    },
    "mulo-local-rows": {"rejection": "local", "l": 1, "rows_per_cycle": 2, "tau": 0.01, "k": 2},
    "mulo-naive-serial-refresh": {
        "rejection": "naive", "parallel": False, "refresh_after_resample": True, "rows_per_cycle": 1,
        "tau": 0.02, "k": 2,
    },
    "mulo-raster": {"rejection": "raster", "rows_per_cycle": 2, "tau": 0.001, "k": 2},
}  # fmt: skip
METHODS = ["ar", "zipar", "lantern", "eagle2", *MULO]
LOCKSTEP = ["lantern", *MULO]  # decoded together in lockstep (methods/lockstep.py)


@pytest.fixture(scope="module")
def models():
    target = tiny_gpt((H, W), V, 0)
    return target, tiny_gpt((H, W), V, 1), tiny_gpt((H // 2, W // 2), V, 1), tiny_head(target, 1)


def decode(name, models, cond, generator, sampler=GUIDED):
    return decode_method(name, models, cond, sampler, generator, NEIGHBOURS, MULO.get(name))


def generators(seeds):
    return [torch.Generator().manual_seed(seed) for seed in seeds]


def counts(stats) -> dict:
    return {name: getattr(stats, name) for name in COUNTS} | {
        "islands": stats.island_sizes,
        "per_cycle": stats.islands_per_cycle,
        "accepted": stats.accepted_per_cycle,
    }


@pytest.mark.parametrize("sampler", [GUIDED, PLAIN], ids=["guided", "plain"])
@pytest.mark.parametrize("name", METHODS)
def test_batch_equals_single(models, name, sampler):
    batch = decode(name, models, PROMPTS, generators(SEEDS), sampler)
    alone = [
        decode(name, models, PROMPTS[b : b + 1], torch.Generator().manual_seed(seed), sampler)
        for b, seed in enumerate(SEEDS)
    ]
    for b, single in enumerate(alone):
        assert torch.equal(batch.tokens[b], single.tokens[0]), f"image {b} differs from its decode alone"
    if name in LOCKSTEP:
        # each image's own record is its decode alone, call for call
        assert [counts(image) for image in batch.stats.per_image] == [counts(s.stats) for s in alone]
        own = [s.stats.sequential_steps for s in alone]
        assert max(own) <= batch.stats.sequential_steps < sum(own)
        assert batch.stats.tokens_accepted == sum(s.stats.tokens_accepted for s in alone)


@pytest.mark.parametrize("name", LOCKSTEP)
def test_prompts_take_different_schedules(models, name):
    # the images really do differ in cycles / islands / accept lengths, so rows idle and pad
    batch = decode(name, models, PROMPTS, generators(SEEDS))
    schedules = {(image.sequential_steps, tuple(image.island_sizes)) for image in batch.stats.per_image}
    assert len(schedules) > 1
    assert batch.stats.tokens_padding > 0
    row = batch.stats.as_dict()
    assert row["image_sequential_steps_max"] == max(image.sequential_steps for image in batch.stats.per_image)


def test_default_one_cycle_mulo_batches_islands(models):
    # one cycle, local rejection (the default): prefill, draft, up-sample and verify are shared; the island
    # steps are one call for all images, so the batch costs the steps of its slowest image
    batch = decode("mulo-local", models, PROMPTS, generators(SEEDS))
    own = [image.sequential_steps for image in batch.stats.per_image]
    assert batch.stats.sequential_steps == max(own)
    assert batch.stats.upsampler_calls == 1


def test_one_shared_generator_decodes_one_image_after_another(models):
    # a single generator is one stream for the whole batch: the images are decoded in turn, as before
    shared = decode("mulo-local", models, PROMPTS[:2], torch.Generator().manual_seed(3))
    assert shared.stats.per_image == []
    first = decode("mulo-local", models, PROMPTS[:1], torch.Generator().manual_seed(3))
    assert torch.equal(shared.tokens[0], first.tokens[0])


def test_wrong_generator_count_is_an_error(models):
    with pytest.raises(ValueError, match="list of 4"):
        decode("mulo-local", models, PROMPTS, generators(SEEDS[:3]))
