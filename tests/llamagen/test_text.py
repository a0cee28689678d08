"""T5 caption conditioning: LlamaGen's tokenisation, left-padding and mask, checked by hand on a tiny random
FLAN-T5 folder (tests/official_fixtures.py)."""

import io

import numpy as np
import pytest
import torch
import webdataset as wds
from mulo_sd.data.cli import main as data_main
from mulo_sd.data.cli import synthscenes_sample
from mulo_sd.data.pretokenize import ensure_pretokenized
from mulo_sd.data.shards import write_shards

from mulo_sd.llamagen import gpt_from_official
from mulo_sd.llamagen.t5 import FEATURES_MEMBER, T5TextEncoder, left_pad
from tests.helpers import tiny_vq
from tests.official_fixtures import CAPTION_DIM, GPT_HEADS, T5_WORDS, write_llamagen_gpt, write_tiny_t5

LENGTH = 8  # max_length of these tests (LlamaGen: 120)
CAPTIONS = ["A red circle", "blue star on the left of a big square", "  Green "]


def word(w: str) -> int:
    return 3 + T5_WORDS.index(w)  # the tiny vocabulary: 0 <pad>, 1 </s>, 2 <unk>, then the words


@pytest.fixture(scope="module")
def t5_folder(tmp_path_factory):
    return write_tiny_t5(tmp_path_factory.mktemp("flan-t5-tiny"))


def test_captions_are_encoded_as_llamagen_does(t5_folder):
    encoder = T5TextEncoder(t5_folder, max_length=LENGTH)
    tokens = encoder.tokenize(CAPTIONS)
    # by hand: lowercased, stripped, </s> appended, right-padded with <pad>, the long caption cut at 8 tokens
    a, b, c = word("a"), word("red"), word("circle")
    expected_ids = [
        [a, b, c, 1, 0, 0, 0, 0],
        [word(w) for w in ("blue", "star", "on", "the", "left", "of", "a")] + [1],
        [word("green"), 1, 0, 0, 0, 0, 0, 0],
    ]
    assert tokens["input_ids"].tolist() == expected_ids
    assert tokens["attention_mask"].sum(1).tolist() == [4, 8, 2]

    features, mask = encoder(CAPTIONS)
    # LlamaGen's sample_t2i.py on the padded batch: T5 with the attention mask, then flip the mask, rotate
    # each row's valid tokens to the end and zero the rest
    with torch.no_grad():
        hidden = encoder.model(input_ids=tokens["input_ids"], attention_mask=tokens["attention_mask"])[0]
    emb_masks = tokens["attention_mask"]
    new_masks = torch.flip(emb_masks, dims=[-1])
    rotated = []
    for emb, emb_mask in zip(hidden, emb_masks, strict=True):
        valid = int(emb_mask.sum())
        rotated.append(torch.cat([emb[valid:], emb[:valid]]))
    want = torch.stack(rotated) * new_masks[:, :, None]
    assert torch.equal(features, want)
    assert torch.equal(mask, new_masks.bool())
    # and the layout by hand: caption 0 has 4 zero rows, then its 4 token rows in order
    assert mask[0].tolist() == [False] * 4 + [True] * 4 and mask[1].all() and mask[2].sum() == 2
    assert torch.equal(features[0, :4], torch.zeros(4, CAPTION_DIM)) and torch.equal(
        features[0, 4:], hidden[0, :4]
    )
    assert torch.equal(features[2, 6:], hidden[2, :2])


def test_stored_rows_left_pad_to_the_encoder_output(t5_folder):
    encoder = T5TextEncoder(t5_folder, max_length=LENGTH)
    rows = encoder.valid_rows(CAPTIONS)
    assert [r.shape[0] for r in rows] == [4, 8, 2]
    stored = [torch.from_numpy(r.numpy().astype("float32")) for r in rows]  # as pretokenize stores them
    features, mask = left_pad(stored, LENGTH)
    want_features, want_mask = encoder(CAPTIONS)
    assert torch.equal(features, want_features) and torch.equal(mask, want_mask)
    cut, cut_mask = left_pad(stored, 3)  # dataset/t2i.py keeps a stored feature's first rows
    assert torch.equal(cut[1], stored[1][:3]) and cut_mask[2].tolist() == [False, True, True]


def test_bf16_and_the_gpt_prefix(t5_folder, tmp_path):
    encoder = T5TextEncoder(t5_folder, dtype="bf16", max_length=LENGTH)
    features, mask = encoder(CAPTIONS)
    assert features.dtype == torch.bfloat16
    full = T5TextEncoder(t5_folder, max_length=LENGTH)(CAPTIONS)[0]
    torch.testing.assert_close(features.float(), full, atol=0.1, rtol=0.05)

    write_llamagen_gpt(tmp_path / "t2i.pt", 32, LENGTH)
    gpt = gpt_from_official(tmp_path / "t2i.pt", n_head=GPT_HEADS)
    encoder.check_fits(gpt.config)
    state = gpt.start(features, cfg_scale=7.5, cond_mask=mask)
    assert state.first_logits.shape == (3, gpt.vocab_size) and torch.isfinite(state.first_logits).all()
    with pytest.raises(ValueError, match="encode captions with max_length=8, not 120"):
        T5TextEncoder(t5_folder).check_fits(gpt.config)


def test_missing_t5_files_name_what_to_put_where(t5_folder, tmp_path):
    with pytest.raises(
        FileNotFoundError, match=r"T5 folder .*absent not found: put google/flan-t5-xl's files"
    ):
        T5TextEncoder(tmp_path / "absent")
    partial = tmp_path / "flan-t5-xl"
    partial.mkdir()
    (partial / "config.json").write_text((t5_folder / "config.json").read_text())
    with pytest.raises(FileNotFoundError, match=r"lacks tokenizer.json or spiece.model, model.safetensors"):
        T5TextEncoder(partial)
    with pytest.raises(ValueError, match="dtype must be one of"):
        T5TextEncoder(t5_folder, dtype="int8")


def test_pretokenize_stores_the_valid_rows(t5_folder, tmp_path, capsys):
    """`mulo-data pretokenize --text-encoder` keeps each caption's valid T5 rows; left_pad of a batch of them
    is what the encoder gives the GPT."""
    captions = ["a red circle", "blue star on the left of a big square", "green"]
    samples = [synthscenes_sample(i, seed=1, size=32) | {"txt": c.encode()} for i, c in enumerate(captions)]
    write_shards(samples, str(tmp_path / "images"), "img", shard_size=10)
    vq = str(tiny_vq(0, ch_mult=(1, 1, 1)).save_pretrained(tmp_path / "vq"))
    args = ["--shards", str(tmp_path / "images/img-000000.tar"), "--tokenizer", vq, "--sizes", "32"]
    text = ["--text-encoder", str(t5_folder), "--text-max-length", str(LENGTH)]
    assert data_main(["pretokenize", *args, "--out", str(tmp_path / "tokens"), *text]) == 0
    stored = list(wds.WebDataset(str(tmp_path / "tokens/img-000000.tar"), shardshuffle=False))
    assert [sample["txt"].decode() for sample in stored] == captions
    rows = [torch.from_numpy(np.load(io.BytesIO(sample[FEATURES_MEMBER]))) for sample in stored]
    assert [(r.dtype, r.shape) for r in rows] == [(torch.float32, (n, CAPTION_DIM)) for n in (4, 8, 2)]
    features, mask = T5TextEncoder(t5_folder, max_length=LENGTH)(captions)
    assert torch.equal(left_pad(rows, LENGTH)[0], features) and torch.equal(left_pad(rows, LENGTH)[1], mask)

    shards, cached = str(tmp_path / "images/img-000000.tar"), str(tmp_path / "cached")
    spec = ensure_pretokenized(shards, vq, [32], cached, text_encoder=t5_folder)
    assert FEATURES_MEMBER in next(iter(wds.WebDataset(spec, shardshuffle=False)))
    with pytest.raises(ValueError, match="max_length"):  # other caption settings: refused, not reused
        ensure_pretokenized(shards, vq, [32], cached, text_encoder=t5_folder, text_max_length=LENGTH)
