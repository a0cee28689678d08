"""MuLo-SD with an up-sampler that reads the caption: each image's up-sampler call gets that image's caption
(the target's condition), and a batch decodes every image as it decodes alone; with several hypotheses, each
image draws one and keeps it through every cycle."""

import torch

from mulo_sd.decoding.methods import decode_mulo
from mulo_sd.decoding.sampling import SamplerConfig
from mulo_sd.nets.upsampler import Upsampler
from tests.decoding.test_mulo import H, StridedDownsampler, V, W
from tests.helpers import tiny_gpt
from tests.nets.test_caption_upsampler import reader
from tests.nets.test_hypothesis_upsampler import model as hypotheses_model

PROMPTS = torch.tensor([[1, 4, 7], [2, 2, 9], [5, 3, 1]])
KNOBS = dict(rejection="local", l=1, tau=0.0001, k=2)
SAMPLER = SamplerConfig(temperature=1.0, cfg_scale=2.0)


class Spy:
    """The up-sampler, with the captions it was called with."""

    def __init__(self, model: Upsampler):
        self.model, self.captions, self.drawn = model, [], []

    def __getattr__(self, name):
        return getattr(self.model, name)

    def upsample_rows(self, ids_low, first_row, cond=None, cond_mask=None, **hypothesis):
        self.captions.append(cond.clone())
        self.drawn += [int(h) for h in hypothesis.values()]
        return self.model.upsample_rows(ids_low, first_row, cond=cond, cond_mask=cond_mask, **hypothesis)


def decode(upsampler, prompts, seeds, **knobs):
    target, drafter = tiny_gpt((H, W), V, 0), tiny_gpt((H // 2, W // 2), V, 1)
    generator = [torch.Generator().manual_seed(seed) for seed in seeds]
    neighbours = torch.arange(V)[:, None].repeat(1, 2)
    return decode_mulo(
        target, drafter, upsampler, StridedDownsampler(2), prompts, SAMPLER,
        generator if len(seeds) > 1 else generator[0], neighbours=neighbours, **{**KNOBS, **knobs},
    )  # fmt: skip


def test_each_image_s_up_sampler_call_gets_its_caption():
    spy = Spy(reader())
    decode(spy, PROMPTS[1:2], [5])
    assert spy.captions and all(torch.equal(caption, PROMPTS[1:2]) for caption in spy.captions)


def test_a_batch_with_a_caption_reader_decodes_each_image_as_alone():
    upsampler = reader()
    batch = decode(upsampler, PROMPTS, [11, 12, 13])
    for b, seed in enumerate([11, 12, 13]):
        alone = decode(upsampler, PROMPTS[b : b + 1], [seed])
        assert torch.equal(batch.tokens[b], alone.tokens[0]), f"image {b} differs from its decode alone"


def test_each_image_drafts_one_hypothesis_through_every_cycle_and_a_batch_decodes_as_alone():
    picks = []
    for seed in range(8):
        spy = Spy(hypotheses_model(3))
        result = decode(spy, PROMPTS[:1], [seed], rows_per_cycle=1)
        assert result.stats.cycles > 1 and len(spy.drawn) == result.stats.cycles
        assert len(set(spy.drawn)) == 1, f"seed {seed} switched hypotheses: {spy.drawn}"
        picks.append(spy.drawn[0])
    assert len(set(picks)) > 1, f"every seed drew hypothesis {picks[0]}"
    upsampler = hypotheses_model(3)
    batch = decode(upsampler, PROMPTS, [11, 12, 13], rows_per_cycle=1)
    for b, seed in enumerate([11, 12, 13]):
        alone = decode(upsampler, PROMPTS[b : b + 1], [seed], rows_per_cycle=1)
        assert torch.equal(batch.tokens[b], alone.tokens[0]), f"image {b} differs from its decode alone"
