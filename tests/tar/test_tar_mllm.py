"""TarMLLM: Tar's prompt, prompts and the unconditional prompt left-padded into one HFCausalLM batch, codes
sampled over the image tokens only, TA-Tok features as Tar's decoder computes them."""

import json

import pytest
import torch
from torch.nn import functional as F
from transformers import Siglip2VisionConfig, Siglip2VisionModel

from mulo_sd.decoding.sampling import SamplerConfig
from mulo_sd.decoding.stats import DecodeStats
from mulo_sd.nets.guidance import guide
from mulo_sd.tar.mllm import TarMLLM
from mulo_sd.tar.tatok import TATokDecoder, TATokError
from tests.tar_fixtures import (
    TATOK_CODE_DIM,
    TATOK_CODES,
    TATOK_DECODER_PATCHES,
    TATOK_SIDE,
    TATOK_TOKENS,
    write_tatok_file,
    write_tiny_tar_mllm,
)

FEATURES = 24  # a multiple of SigLIP2's 12 heads: the decoder exactly as Tar builds it
PROMPTS = ["a red circle on the left of a blue star", "a star"]  # different lengths: padding is exercised
TAR_PROMPT = (  # Tar's eval/eval_dpg_bench.py get_prompt_template, written out
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n"
    "<|im_start|>assistant\n<im_start><S{}>"
)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("tar")
    state = write_tatok_file(root / "ta_tok.pth", FEATURES)
    return write_tiny_tar_mllm(root / "mllm"), root / "ta_tok.pth", state


@pytest.fixture(scope="module")
def mllm(files):
    return TarMLLM.from_pretrained(files[0], files[1])


def prompt_ids(mllm, prompt):
    return mllm.tokenizer(mllm.prompt_text(prompt))["input_ids"]


def image_logits(mllm, prefix, codes):
    """Image-token logits [len(codes) + 1, V] of one unpadded sequence, one full forward, no cache."""
    offset = mllm.image_token_offset
    ids = torch.tensor([prefix + [offset + c for c in codes]])
    with torch.no_grad():
        logits = mllm.model(ids).logits[0, len(prefix) - 1 :]
    return logits[:, offset : offset + TATOK_CODES]


def tatok_reference(state, ids, l2_normalized=True, width=FEATURES, heads=12):
    """Tar's decode_from_bottleneck for the fixture's file, from its tensors (tests/tar_fixtures.py)."""

    def linear(x, name):
        return F.linear(x, state[f"{name}.weight"], state[f"{name}.bias"])

    codebook = linear(
        state["bottleneck.regularizer.embedding.weight"], "bottleneck.regularizer.embedding_proj"
    )
    if l2_normalized:
        codebook = F.normalize(codebook, dim=-1)
    codes = linear(codebook[ids], "bottleneck.out_linear")
    config = Siglip2VisionConfig(
        hidden_size=width,
        intermediate_size=2 * width,
        num_hidden_layers=2,
        num_attention_heads=heads,
        num_channels=TATOK_CODE_DIM,
        num_patches=TATOK_DECODER_PATCHES,
        patch_size=1,
    )
    decoder = Siglip2VisionModel(config).eval()
    decoder.load_state_dict(
        {k.removeprefix("decoder."): v for k, v in state.items() if k.startswith("decoder.")}
    )
    shapes = torch.tensor([[TATOK_SIDE, TATOK_SIDE]] * ids.shape[0])
    with torch.no_grad():
        hidden = decoder(codes, torch.ones_like(ids), shapes).last_hidden_state
        return linear(torch.tanh(linear(hidden, "decode_task_layer.0")), "decode_task_layer.2")


def test_prompt_is_tars_and_the_grid_follows_the_scale_token(files, mllm):
    assert mllm.prompt_text("a star") == TAR_PROMPT.format("a star", 0)
    assert (mllm.grid_size, mllm.clip_dim, mllm.tatok.codebook_size) == ((3, 3), FEATURES, TATOK_CODES)
    coarse = TarMLLM.from_pretrained(files[0], files[1], scale=1)
    assert coarse.prompt_text("") == TAR_PROMPT.format("", 1)
    assert coarse.grid_size == (1, 1)  # Tar's avg_pool: 3 // 2


@pytest.mark.parametrize("cfg_scale", [1.0, 3.0])
def test_stepwise_logits_equal_full_forwards_of_the_unpadded_prompts(mllm, cfg_scale):
    adapter, ids, mask = mllm.condition(PROMPTS)
    assert not mask[1].all() and mask[:, -1].all()  # left padding: the short prompt's row starts with it
    codes = torch.randint(0, TATOK_CODES, (2, TATOK_TOKENS), generator=torch.Generator().manual_seed(1))
    state = adapter.start(ids, cfg_scale, cond_mask=mask)
    got = [state.first_logits[:, None]]
    for t in range(TATOK_TOKENS - 1):
        got.append(adapter.step(state, codes[:, t : t + 1], torch.tensor([t])))
    got = torch.cat(got, dim=1)
    uncond = prompt_ids(mllm, "")
    for row, prompt in enumerate(PROMPTS):
        previous = codes[row, :-1].tolist()
        want = image_logits(mllm, prompt_ids(mllm, prompt), previous)
        if cfg_scale != 1.0:
            want = guide(want, image_logits(mllm, uncond, previous), cfg_scale)
        torch.testing.assert_close(got[row], want, rtol=1e-5, atol=2e-5)  # RoPE at shifted positions


def greedy_reference(mllm, prompt, cfg_scale):
    """Greedy decoding by hand: one full forward (two with guidance) per code, no cache, no padding."""
    codes = []
    for _ in range(TATOK_TOKENS):
        logits = image_logits(mllm, prompt_ids(mllm, prompt), codes)[-1]
        if cfg_scale != 1.0:
            logits = guide(logits, image_logits(mllm, prompt_ids(mllm, ""), codes)[-1], cfg_scale)
        codes.append(int(logits.argmax()))
    return codes


@pytest.mark.parametrize("cfg_scale", [1.0, 3.0])
def test_greedy_generate_equals_a_greedy_loop_over_full_forwards(files, mllm, cfg_scale):
    greedy = SamplerConfig(temperature=0.0, cfg_scale=cfg_scale)
    stats = DecodeStats(batch_size=2)
    ids, features = mllm.generate(PROMPTS, sampler=greedy, generator=torch.Generator(), stats=stats)
    assert ids.tolist() == [greedy_reference(mllm, p, cfg_scale) for p in PROMPTS]
    torch.testing.assert_close(features, tatok_reference(files[2], ids))
    again = mllm.generate(PROMPTS, sampler=greedy, generator=torch.Generator().manual_seed(5))
    assert torch.equal(again[0], ids) and torch.equal(again[1], features)
    assert (stats.batch_size, stats.target_forwards, stats.tokens_evaluated) == (2, 9, 2 * 8)
    assert stats.wall_seconds >= stats.phase_seconds["tatok"] > 0


def test_sampled_codes_are_image_codes_with_their_features_and_repeat_with_the_seed(files, mllm):
    sampler = SamplerConfig(temperature=1.0, top_k=6, cfg_scale=3.0)
    runs = [
        mllm.generate(PROMPTS * 4, sampler=sampler, generator=torch.Generator().manual_seed(s))
        for s in (0, 0, 1)
    ]
    ids, features = runs[0]
    assert ids.shape == (8, TATOK_TOKENS) and 0 <= ids.min() and ids.max() < TATOK_CODES
    assert features.shape == (8, TATOK_TOKENS, FEATURES)
    torch.testing.assert_close(features, tatok_reference(files[2], ids))
    assert torch.equal(runs[1][0], ids) and not torch.equal(runs[2][0], ids)


@pytest.mark.parametrize("l2_normalized", [False, True])
def test_tatok_features_without_l2_and_with_a_stored_head_count(tmp_path, l2_normalized):
    state = write_tatok_file(tmp_path / "t.pth", 16, l2_normalized=l2_normalized)  # 16 wide: 4 heads, stored
    tatok = TATokDecoder.from_checkpoint(tmp_path / "t.pth")
    ids = torch.randint(0, TATOK_CODES, (2, TATOK_TOKENS), generator=torch.Generator().manual_seed(2))
    want = tatok_reference(state, ids, l2_normalized, width=16, heads=4)
    torch.testing.assert_close(tatok(ids), want)


def test_a_folder_of_another_model_family_names_the_field(tmp_path, files):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(
        ValueError, match=r"config.json: model_type is 'llama', but Tar's MLLM is a Qwen2-family"
    ):
        TarMLLM.from_pretrained(tmp_path, files[1])


def test_a_tatok_file_without_the_codebook_names_the_file_and_its_keys(tmp_path, files):
    path = tmp_path / "other.pth"
    torch.save({"model": {"args": {}, "sd": {"decoder.weight": torch.zeros(2)}}}, path)
    wrong = r"other.pth: no TA-Tok codebook 'bottleneck.regularizer.embedding.weight' under model.sd; "
    with pytest.raises(TATokError, match=wrong + r"the file has keys \['decoder.weight'\]"):
        TarMLLM.from_pretrained(files[0], path)
    torch.save({"state_dict": {}}, path)
    with pytest.raises(TATokError, match=r"other.pth: expected Tar's layout .* found \['state_dict'\]"):
        TATokDecoder.from_checkpoint(path)


@pytest.mark.parametrize("image_tokens", [0, TATOK_CODES // 2])
def test_a_vocabulary_without_all_image_tokens_is_an_error(tmp_path, files, image_tokens):
    folder = write_tiny_tar_mllm(tmp_path / "mllm", codebook_size=image_tokens, image_tokens=image_tokens > 0)
    with pytest.raises(
        ValueError, match=r"mllm: the tokenizer lacks Tar's image tokens <I0>..<I15> as consecutive"
    ):
        TarMLLM.from_pretrained(folder, files[1])


def test_a_scale_without_its_token_is_an_error(files):
    with pytest.raises(ValueError, match=r"scale must be one of \[0, 1, 2\] \(Tar's <S0>..<S2>\), got 3"):
        TarMLLM.from_pretrained(files[0], files[1], scale=3)
