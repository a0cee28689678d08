"""MuLo-SD with an up-sampler that reads the caption: each image's up-sampler call gets that image's caption
(the target's condition), and a batch decodes every image as it decodes alone."""

import torch

from mulo_sd.decoding.methods import decode_mulo
from mulo_sd.decoding.sampling import SamplerConfig
from mulo_sd.nets.upsampler import Upsampler
from tests.decoding.test_mulo import H, StridedDownsampler, V, W
from tests.helpers import tiny_gpt
from tests.nets.test_caption_upsampler import reader

PROMPTS = torch.tensor([[1, 4, 7], [2, 2, 9], [5, 3, 1]])
KNOBS = dict(rejection="local", l=1, tau=0.0001, k=2)
SAMPLER = SamplerConfig(temperature=1.0, cfg_scale=2.0)


class Spy:
    """The up-sampler, with the captions it was called with."""

    def __init__(self, model: Upsampler):
        self.model, self.captions = model, []

    def __getattr__(self, name):
        return getattr(self.model, name)

    def upsample_rows(self, ids_low, first_row, cond=None, cond_mask=None):
        self.captions.append(cond.clone())
        return self.model.upsample_rows(ids_low, first_row, cond=cond, cond_mask=cond_mask)


def decode(upsampler, prompts, seeds):
    target, drafter = tiny_gpt((H, W), V, 0), tiny_gpt((H // 2, W // 2), V, 1)
    generator = [torch.Generator().manual_seed(seed) for seed in seeds]
    neighbours = torch.arange(V)[:, None].repeat(1, 2)
    return decode_mulo(
        target, drafter, upsampler, StridedDownsampler(2), prompts, SAMPLER,
        generator if len(seeds) > 1 else generator[0], neighbours=neighbours, **KNOBS,
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
