"""The up-sampler that reads the caption (nets/caption_film.py): it starts as the up-sampler it is initialised
from, its drafts then depend on the caption, row by row as before, and it refuses calls that give it the wrong
condition."""

import pytest
import torch

from mulo_sd.nets.upsampler import Upsampler, UpsamplerConfig
from tests.nets.test_samplers import TINY, codebook

WORDS = dict(condition="words", condition_vocab=10)


def reader(seed: int = 1, trained: bool = True, **overrides) -> Upsampler:
    torch.manual_seed(seed)
    model = Upsampler(UpsamplerConfig(r=2, **{**TINY, **WORDS, **overrides}), codebook()).eval()
    if trained:  # a caption reader that has learnt something: its last layer off zero
        torch.nn.init.normal_(model.caption.mlp[-1].weight, std=0.5)
    return model


def grid(h: int, w: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, TINY["codebook_size"], (1, h, w), generator=torch.Generator().manual_seed(seed))


def test_a_fresh_caption_reader_drafts_what_its_tokens_only_twin_drafts():
    plain_config = UpsamplerConfig(r=2, **TINY)
    torch.manual_seed(1)
    plain = Upsampler(plain_config, codebook()).eval()
    fresh = reader(trained=False)
    missing, unexpected = fresh.load_state_dict(plain.state_dict(), strict=False)
    assert not unexpected and all(name.startswith("caption.") for name in missing)
    ids = grid(4, 4).repeat(2, 1, 1)
    captions = torch.tensor([[1, 2, 3], [4, 0, 0]])
    assert torch.equal(fresh(ids, captions)["logits"], plain(ids)["logits"])


def test_the_draft_depends_on_the_caption_and_padding_words_are_ignored():
    model = reader()
    ids = grid(4, 4).repeat(3, 1, 1)
    logits = model(ids, torch.tensor([[1, 2, 3], [5, 6, 7], [3, 2, 1]]))["logits"]
    assert not torch.allclose(logits[0], logits[1])
    assert torch.allclose(logits[0], logits[2], atol=1e-5)  # a bag of words: order is not read
    padded = model(ids[:1], torch.tensor([[1, 2, 0]]))["logits"]
    assert torch.allclose(padded, model(ids[:1], torch.tensor([[0, 1, 2]]))["logits"], atol=1e-5)


@pytest.mark.parametrize("causal", [True, False])
def test_rows_up_sampled_with_the_caption_equal_the_whole_grid(causal):
    model = reader(causal=causal)
    ids, caption = grid(4, 4, seed=3), torch.tensor([[4, 5, 6]])
    whole = model.upsample(ids, caption)
    for first in range(4):
        rows = model.upsample_rows(ids, first, cond=caption)
        assert torch.equal(rows, whole[:, 2 * first :])


def test_feature_captions_are_pooled_over_their_mask():
    model = reader(condition="features", condition_vocab=0, condition_dim=6)
    ids = grid(2, 2).repeat(2, 1, 1)
    rows = torch.randn(1, 3, 6)
    padded = torch.cat([torch.randn(1, 2, 6), rows], 1)  # two padding rows in front, as left_pad writes them
    masks = torch.tensor([[True] * 3 + [False] * 2, [False] * 2 + [True] * 3])
    out = model(ids, torch.cat([torch.cat([rows, torch.zeros(1, 2, 6)], 1), padded]), masks)["logits"]
    assert torch.allclose(out[0], out[1], atol=1e-6)


def test_wrong_conditions_are_refused_with_what_to_pass():
    with pytest.raises(ValueError, match="pass cond, the caption as the target takes it"):
        reader().upsample(grid(2, 2))
    with pytest.raises(ValueError, match="reads no caption"):
        Upsampler(UpsamplerConfig(r=2, **TINY), codebook()).upsample(grid(2, 2), torch.tensor([[1, 2, 3]]))
    with pytest.raises(ValueError, match="2 captions for 1 token grids"):
        reader().upsample(grid(2, 2), torch.tensor([[1, 2, 3], [1, 2, 3]]))
    with pytest.raises(ValueError, match="takes word ids"):
        reader().upsample(grid(2, 2), torch.randn(1, 3, 4))
    with pytest.raises(ValueError, match="condition 'words' needs condition_vocab >= 1"):
        UpsamplerConfig(r=2, **TINY, condition="words")
    with pytest.raises(ValueError, match="condition must be one of"):
        UpsamplerConfig(r=2, **TINY, condition="caption")


def test_a_caption_reader_round_trips_through_its_folder(tmp_path):
    model = reader()
    loaded = Upsampler.from_pretrained(model.save_pretrained(tmp_path / "up"))
    ids, caption = grid(4, 4), torch.tensor([[7, 8, 9]])
    assert loaded.config.condition == "words"
    assert torch.equal(loaded.upsample(ids, caption), model.upsample(ids, caption))
