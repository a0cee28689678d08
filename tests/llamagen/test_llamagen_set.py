"""LlamaGen text-to-image as a model set: official-layout files -> `mulo-convert` -> `mulo-decode
models=llamagen_t2i_xl_512` with every method, T5 captions, and the set's mismatches refused before any
weights are read."""

import shutil

import pytest
import torch
from mulo_sd.training.decode import run
from PIL import Image

from mulo_sd.decoding.sampling import SamplerConfig
from mulo_sd.llamagen import gpt_from_official
from mulo_sd.nets import io as model_io
from mulo_sd.nets.gpt import GPT
from mulo_sd.nets.upsampler import Upsampler, UpsamplerConfig
from mulo_sd.pipeline import mulo_pipeline
from mulo_sd.pipeline.decode_entry import decode
from mulo_sd.pipeline.model_set import ModelSet, load_model_set
from tests.llamagen_fixtures import (
    DRAFTER_SIZE,
    FOLDERS,
    SET_NAME,
    SMALL_DRAFTER,
    TARGET_SIZE,
    set_overrides,
    write_llamagen_set,
)
from tests.official_fixtures import GPT_HEADS, write_llamagen_gpt, write_tiny_t5
from tests.training.test_decode_cli import compose

PROMPT = "prompt='a big red circle on the left of a blue star'"
# the knobs each method runs with on the tiny set (LANTERN's recommended k=64 pools the whole 64-code book)
METHODS = {"ar": [], "zipar": ["knobs.window=2"], "lantern": ["knobs.k=8"], "mulo": ["knobs.tau=0.05"]}


@pytest.fixture(scope="module", params=[120, 16], ids=["cls120", "cls16"])
def llamagen_root(request, tmp_path_factory):
    return write_llamagen_set(tmp_path_factory.mktemp(f"ckpts{request.param}"), cls_token_num=request.param)


def forbid_weights(monkeypatch) -> None:
    """From here on, reading any weights or decoding fails the test: errors must come from the configs."""

    def fail(*args, **kwargs):
        raise AssertionError("weights were read or a decode ran before the set was checked")

    monkeypatch.setattr(model_io, "read_weights", fail)
    monkeypatch.setattr(mulo_pipeline, "decode", fail)


def set_config(root, **folders) -> ModelSet:
    base = dict(FOLDERS, drafter_small=SMALL_DRAFTER)
    return ModelSet.from_config(
        {"name": SET_NAME, "family": "llamagen", "root": str(root), "folders": {**base, **folders}}
    )


@pytest.mark.parametrize("method", list(METHODS))
def test_each_method_decodes_a_caption_on_the_converted_set(llamagen_root, tmp_path, method):
    out = tmp_path / "sample.png"
    overrides = set_overrides(llamagen_root, f"method={method}", PROMPT, f"out={out}", *METHODS[method])
    stats = run(compose("decode", tmp_path, overrides))
    assert Image.open(out).size == (TARGET_SIZE, TARGET_SIZE)
    if method in ("ar", "zipar"):  # 4x4 grid: 16 calls, ZipAR's w + (h - 1) * W = 4 + 3 * 2
        assert stats["target_forwards"] == {"ar": 16, "zipar": 10}[method]
    else:
        assert stats["tokens_accepted"] + stats["tokens_resampled"] == 16  # every position once
        assert stats["drafter_forwards"] >= 1
    if method == "mulo":
        assert stats["upsampler_calls"] == stats["cycles"] >= 1


def test_the_set_brings_llamagens_sampling_defaults_bf16_and_cuda(llamagen_root, tmp_path, monkeypatch):
    seen = {}

    def record(*args):
        seen["args"] = args
        raise Stopped

    monkeypatch.setattr(mulo_pipeline, "load_model_set", record)
    cfg = compose("decode", tmp_path, [f"models={SET_NAME}", f"models.root={llamagen_root}", PROMPT])
    assert dict(cfg.sampler) == {"temperature": 1.0, "top_k": 1000, "top_p": 1.0, "cfg_scale": 7.5}
    with pytest.raises(Stopped):
        run(cfg)  # words outside the testbed's caption vocabulary are fine: T5 reads any text
    model_set, names, device = seen["args"]
    assert names == ["vq", "target"] and device == "cuda" and model_set.dtype == "bfloat16"
    assert model_set.folders["text_encoder"] == llamagen_root / "flan-t5-xl"


class Stopped(Exception):
    pass


def test_bf16_loads_the_gpts_and_t5_in_bf16_and_keeps_the_vq_in_float32(llamagen_root):
    model_set = set_config(llamagen_root)
    model_set.dtype = "bfloat16"
    models = load_model_set(model_set, ["vq", "target", "drafter_r2", "upsampler_r2"])
    assert models.target.output.weight.dtype == torch.bfloat16
    assert models.drafters["drafter_r2"].output.weight.dtype == torch.bfloat16
    assert models.text_encoder.model.dtype == torch.bfloat16
    assert models.tokenizer.codebook.dtype == torch.float32
    result = decode("ar", models, ["a red star"], {}, SamplerConfig(temperature=0.0, cfg_scale=7.5), seed=0)
    assert result.tokens.shape == (1, 4, 4) and result.image.shape == (1, 3, TARGET_SIZE, TARGET_SIZE)


def test_captions_become_t5_features_with_left_padding(llamagen_root):
    models = load_model_set(set_config(llamagen_root), ["vq", "target"])
    cond, mask = models.condition(["a red star", "a big blue circle on the left of a small green square"])
    length = models.target.config.cond_len
    assert cond.shape == (2, length, 16) and mask.shape == (2, length)
    counts = mask.sum(1).tolist()
    assert counts[0] < counts[1] and all(mask[i, length - n :].all() for i, n in enumerate(counts))
    assert cond[~mask].abs().sum() == 0  # padding rows are zero, the valid rows last
    assert torch.equal(
        cond, models.text_encoder(["a red star", "a big blue circle on the left of a small green square"])[0]
    )


def test_greedy_mulo_with_exact_acceptance_equals_greedy_ar(llamagen_root):
    """docs/algorithm.md: temperature 0, k = 0, tau = 1 and rejection='raster' keep exactly AR's tokens."""
    models = load_model_set(set_config(llamagen_root))
    greedy = SamplerConfig(temperature=0.0, top_k=1000, cfg_scale=7.5)
    prompts = ["a red circle", "a big green star on the left of the blue square"]
    reference = decode("ar", models, prompts, {}, greedy, seed=0)
    exact = {"rejection": "raster", "k": 0, "tau": 1.0}
    mulo = decode("mulo", models, prompts, exact, greedy, seed=1)
    assert torch.equal(mulo.tokens, reference.tokens) and mulo.stats.tokens_drafted >= 16
    lantern = decode("lantern", models, prompts, {"delta": 0.0, "k": 0}, greedy, seed=2)
    assert torch.equal(lantern.tokens, reference.tokens)


def test_lantern_without_a_small_drafter_names_the_role(llamagen_root, tmp_path, monkeypatch):
    forbid_weights(monkeypatch)
    overrides = set_overrides(llamagen_root, "method=lantern", PROMPT, "models.folders.drafter_small=null")
    with pytest.raises(
        FileNotFoundError, match=r"has no drafter_small folder \(LANTERN drafts with a smaller"
    ):
        run(compose("decode", tmp_path, overrides))


def test_a_missing_root_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match=r"models.root is not set: give the folder that holds its model"):
        run(compose("decode", tmp_path, [f"models={SET_NAME}", PROMPT]))


def test_a_missing_t5_folder_is_an_error_before_any_weights(llamagen_root, tmp_path, monkeypatch):
    forbid_weights(monkeypatch)
    overrides = set_overrides(llamagen_root, PROMPT, "models.folders.text_encoder=no-such-t5")
    with pytest.raises(
        FileNotFoundError, match=r"text_encoder folder .*no-such-t5 not found: put google/flan-t5"
    ):
        run(compose("decode", tmp_path, overrides))
    overrides = set_overrides(llamagen_root, PROMPT, "models.folders.text_encoder=null")
    with pytest.raises(FileNotFoundError, match=r"has no text_encoder folder \(the T5 encoder of the set's"):
        run(compose("decode", tmp_path, overrides))


def test_a_t5_of_another_width_is_an_error_before_any_weights(llamagen_root, tmp_path, monkeypatch):
    write_tiny_t5(tmp_path / "t5_32", d_model=32)
    forbid_weights(monkeypatch)
    overrides = set_overrides(llamagen_root, PROMPT, f"models.folders.text_encoder={tmp_path / 't5_32'}")
    with pytest.raises(
        ValueError, match=r"takes caption_dim 16, but the text_encoder gives 32-d T5 features"
    ):
        run(compose("decode", tmp_path, overrides))


def test_a_drafter_at_the_wrong_resolution_is_an_error(llamagen_root, tmp_path, monkeypatch):
    forbid_weights(monkeypatch)
    overrides = set_overrides(
        llamagen_root, "method=mulo", PROMPT, f"models.folders.drafter_r2={SMALL_DRAFTER}"
    )
    wrong = r"drafter_r2 \(.*\) has grid_size \[4, 4\], but the target's 4x4 grid over r=2 is \[2, 2\]"
    with pytest.raises(ValueError, match=wrong):
        run(compose("decode", tmp_path, overrides))
    overrides = set_overrides(
        llamagen_root, "method=lantern", PROMPT, f"models.folders.drafter_small={FOLDERS['drafter_r2']}"
    )
    with pytest.raises(
        ValueError, match=r"drafter_small \(.*\) has grid_size \[2, 2\], but the target's grid"
    ):
        run(compose("decode", tmp_path, overrides))


def test_a_gpt_of_another_codebook_is_an_error(llamagen_root, tmp_path, monkeypatch):
    source, folder = tmp_path / "t2i_32codes.pt", tmp_path / "t2i_32codes"
    write_llamagen_gpt(source, DRAFTER_SIZE, vocab_size=32, args_overrides={"vocab_size": 32})
    gpt_from_official(source, n_head=GPT_HEADS).save_pretrained(folder)
    forbid_weights(monkeypatch)
    overrides = set_overrides(llamagen_root, "method=mulo", PROMPT, f"models.folders.drafter_r2={folder}")
    with pytest.raises(ValueError, match=r"drafter_r2 \(.*\) predicts vocab_size 32 token ids, but the vq"):
        run(compose("decode", tmp_path, overrides))


def decode_with_upsampler(llamagen_root, tmp_path, monkeypatch, code_dim: int, **fields):
    """Decode the LlamaGen set with a random r=2 up-sampler of `code_dim` and these config fields, with
    every weight load forbidden (the set's checks must refuse it first)."""
    config = UpsamplerConfig(r=2, codebook_size=64, code_dim=code_dim, width=8, blocks=1, **fields)
    codebook = torch.nn.functional.normalize(torch.randn(64, code_dim), dim=-1)
    Upsampler(config, codebook).save_pretrained(tmp_path / "up")
    forbid_weights(monkeypatch)
    overrides = set_overrides(
        llamagen_root, "method=mulo", PROMPT, f"models.folders.upsampler_r2={tmp_path / 'up'}"
    )
    run(compose("decode", tmp_path, overrides))


def test_a_sampler_of_another_code_dimension_is_an_error(llamagen_root, tmp_path, monkeypatch):
    wrong = (
        r"upsampler_r2 \(.*\) was trained for codebook_size 64 and code_dim 4, but the vq has codebook_size"
    )
    with pytest.raises(ValueError, match=wrong + r" 64 and codebook_embed_dim 8"):
        decode_with_upsampler(llamagen_root, tmp_path, monkeypatch, 4)


def test_gpts_with_different_caption_prefixes_are_an_error(llamagen_root, tmp_path, monkeypatch):
    length = GPT.load_config(llamagen_root / FOLDERS["target"]).cond_len
    source = tmp_path / "other_prefix.pt"
    write_llamagen_gpt(source, DRAFTER_SIZE, cls_token_num=length - 1)
    gpt_from_official(source, n_head=GPT_HEADS).save_pretrained(tmp_path / "other_prefix")
    forbid_weights(monkeypatch)
    overrides = set_overrides(
        llamagen_root, "method=mulo", PROMPT, f"models.folders.drafter_r2={tmp_path / 'other_prefix'}"
    )
    with pytest.raises(
        ValueError, match=r"the GPTs disagree on cond_len .*convert them with the same --cls-token"
    ):
        run(compose("decode", tmp_path, overrides))


def test_a_missing_sampler_names_the_training_command(llamagen_root, tmp_path):
    root = tmp_path / "ckpts"
    shutil.copytree(llamagen_root, root, ignore=shutil.ignore_patterns("upsampler_r2", "official"))
    missing = (
        r"upsampler_r2 folder .*upsampler_r2 not found: train it: mulo-train experiment=llamagen/upsampler_r2"
    )
    with pytest.raises(FileNotFoundError, match=missing + r" llamagen.root="):
        run(compose("decode", tmp_path, set_overrides(root, "method=mulo", PROMPT)))


def test_decoding_guides_with_the_uncond_embedding_under_the_caption_mask(llamagen_root):
    """LlamaGen's CFG: the unconditional half is uncond_embedding under the caption's own padding mask."""
    models = load_model_set(set_config(llamagen_root), ["vq", "target"])
    target, greedy = models.target, SamplerConfig(temperature=0.0, cfg_scale=7.5)
    first = decode("ar", models, ["a red star"], {}, greedy, seed=0).tokens.flatten()[0]
    cond, mask = models.condition(["a red star"])
    tokens = torch.zeros(1, 1, dtype=torch.long)
    with torch.no_grad():
        c, u = (target(tokens, cond, mask, drop=torch.tensor([drop]))[0, 0] for drop in (False, True))
        unmasked = target(tokens, cond, None, drop=torch.tensor([True]))[0, 0]
    assert first == (u + 7.5 * (c - u)).argmax()
    assert not torch.allclose(unmasked, u)  # the mask matters: padding rows would change the branch


def test_a_cuda_set_on_a_machine_without_cuda_is_a_clear_error(llamagen_root, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    model_set = set_config(llamagen_root)
    model_set.device = "cuda"
    with pytest.raises(
        ValueError, match=r"loads on cuda, but this machine has no CUDA device: set models.device"
    ):
        load_model_set(model_set, ["vq", "target"])


def test_an_up_sampler_reading_captions_the_target_does_not_take_is_an_error(
    llamagen_root, tmp_path, monkeypatch
):
    # the LlamaGen target takes T5 features; this up-sampler reads testbed word ids
    wrong = (
        r"upsampler_r2 \(.*\) reads the caption as word ids of 40 words, but the target takes cond_type 't5'"
    )
    with pytest.raises(ValueError, match=wrong):
        decode_with_upsampler(llamagen_root, tmp_path, monkeypatch, 8, condition="words", condition_vocab=40)
