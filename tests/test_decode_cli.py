import os
from pathlib import Path

import hydra
import pytest
import torch
from hydra.core.hydra_config import HydraConfig
from mulo_sd.training.config import CONFIG_DIR
from mulo_sd.training.decode import run
from omegaconf import DictConfig, open_dict
from PIL import Image

from mulo_sd.captions import MAX_CAPTION_WORDS, VOCAB
from mulo_sd.decode import decode, method_knobs, required_models, resolve_knobs
from mulo_sd.downsampler import Downsampler, DownsamplerConfig
from mulo_sd.gpt import GPT, GPTConfig
from mulo_sd.sampling import SamplerConfig
from mulo_sd.sceneeval import SceneEval, SceneEvalConfig
from mulo_sd.testbed import MODEL_CLASSES, load_models
from mulo_sd.upsampler import Upsampler, UpsamplerConfig
from mulo_sd.vq import VQConfig, VQModel

V = 32
PROMPT = "two red circles left of a blue star on a striped background"


def tiny_gpt(grid: int, seed: int, dim: int = 32) -> GPT:
    torch.manual_seed(seed)
    config = GPTConfig(
        vocab_size=V, grid_size=grid, dim=dim, n_layer=1, n_head=2, cond_type="words",
        cond_len=MAX_CAPTION_WORDS, cond_vocab_size=len(VOCAB), caption_dim=16, multiple_of=16,
    )  # fmt: skip
    model = GPT(config)
    torch.nn.init.normal_(model.output.weight, std=0.5)  # the LlamaGen init zeroes the head: uniform logits
    return model


def save_tiny_testbed(folder: Path, skip: tuple[str, ...] = ()) -> Path:
    """Random models in the testbed layout: ds2 VQ (16 px targets), 8x8 target and small drafter, 4x4 and
    2x2 drafters, latent samplers for r = 2 and 4, and a SceneEval for 16 px images."""
    torch.manual_seed(0)
    vq = VQModel(
        VQConfig(codebook_size=V, codebook_embed_dim=4, encoder_ch_mult=[1, 1], decoder_ch_mult=[1, 1],
                 z_channels=8, ch=8, num_res_blocks=1, norm_groups=4)
    )  # fmt: skip
    models = {
        "vq": vq,
        "target": tiny_gpt(8, 1),
        "drafter_r2": tiny_gpt(4, 2),
        "drafter_r4": tiny_gpt(2, 3),
        "drafter_small": tiny_gpt(8, 4, dim=16),
        "sceneeval": SceneEval(SceneEvalConfig(image_size=16, patch=4, channels=[8, 8])),
    }
    for r in (2, 4):
        sampler = dict(r=r, codebook_size=V, code_dim=4, width=8, blocks=1)
        models[f"upsampler_r{r}"] = Upsampler(UpsamplerConfig(**sampler), vq.codebook.detach())
        models[f"downsampler_r{r}"] = Downsampler(DownsamplerConfig(**sampler), vq.codebook.detach())
    assert set(models) == set(MODEL_CLASSES)
    for name, model in models.items():
        if name not in skip:
            model.save_pretrained(folder / name)
    return folder


@pytest.fixture(scope="module")
def testbed(tmp_path_factory) -> Path:
    return save_tiny_testbed(tmp_path_factory.mktemp("testbed"))


def compose(config_name: str, tmp_path: Path, overrides: list[str]) -> DictConfig:
    """A `mulo-decode` / `mulo-eval` config as the entry point sees it, outputs under tmp_path."""
    run_dir = tmp_path / "run"
    with hydra.initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = hydra.compose(
            config_name,
            overrides=[f"paths.log_dir={tmp_path / 'logs'}", *overrides, f"hydra.run.dir={run_dir}"],
            return_hydra_config=True,
        )
    with open_dict(cfg):  # set by Hydra's launcher, which compose does not run
        cfg.hydra.runtime.output_dir = os.path.abspath(cfg.hydra.run.dir)
    HydraConfig.instance().set_config(cfg)
    with open_dict(cfg):
        del cfg["hydra"]
    return cfg


def test_decode_cli_writes_png_and_returns_stats(testbed, tmp_path):
    out = tmp_path / "sample.png"
    cfg = compose("decode", tmp_path, ["method=zipar", "knobs.window=2", f"models={testbed}", f"out={out}"])
    stats = run(cfg)
    image = Image.open(out)
    assert image.size == (16, 16) and image.mode == "RGB"
    assert stats["target_forwards"] == 8 + 7 * 2  # ZipAR: w + (h - 1) * W
    assert stats["sequential_steps"] == stats["target_forwards"] and stats["wall_s"] > 0


def test_decode_cli_default_output_goes_to_run_dir(testbed, tmp_path):
    cfg = compose("decode", tmp_path, ["method=mulo", "knobs.r=4", "knobs.tau=0.2", "knobs.k=2",
                                       "knobs.upsampler=pixel", f"models={testbed}"])  # fmt: skip
    stats = run(cfg)
    assert (tmp_path / "run" / "sample.png").is_file()
    assert stats["tokens_accepted"] + stats["tokens_resampled"] == 64  # every position exactly once
    assert stats["upsampler_calls"] == stats["cycles"] >= 1


def test_decode_is_repeatable_and_seeded(testbed):
    models = load_models(testbed)
    knobs = {"r": 2, "tau": 0.1, "k": 4}
    sampler = SamplerConfig(cfg_scale=2.0)
    prompts = [PROMPT, "a green hexagon on a noisy background"]
    first = decode("mulo", models, prompts, knobs, sampler, seed=5)
    again = decode("mulo", models, prompts, knobs, sampler, seed=5)
    other = decode("mulo", models, prompts[:1], knobs, sampler, seed=6)
    assert first.tokens.shape == (2, 8, 8) and first.image.shape == (2, 3, 16, 16)
    assert torch.equal(first.tokens, again.tokens)
    assert not torch.equal(first.tokens[:1], other.tokens)


def test_lantern_with_delta_zero_and_greedy_equals_ar(testbed):
    models = load_models(testbed, names=["vq", "target", "drafter_small"])
    greedy = SamplerConfig(temperature=0.0)
    ar = decode("ar", models, [PROMPT], {}, greedy, seed=0)
    lantern = decode("lantern", models, [PROMPT], {"k": 4, "delta": 0.0, "draft_len": 3}, greedy, seed=1)
    assert torch.equal(ar.tokens, lantern.tokens)


def test_knobs_are_validated_with_clear_errors():
    assert method_knobs("ar") == {}
    assert resolve_knobs("mulo", {"r": 2, "tau": 0.5, "k": 0})["downsampler"] == "latent"
    assert required_models("mulo", {"r": 4, "tau": 0.5, "k": 0, "upsampler": "pixel"}) == [
        "vq", "target", "drafter_r4"
    ]  # fmt: skip
    with pytest.raises(ValueError, match=r"unknown decoding method 'beam'; choose one of"):
        resolve_knobs("beam", {})
    with pytest.raises(
        ValueError, match=r"unknown knob\(s\) \['tau'\] for method 'zipar'; it takes \['window'\]"
    ):
        resolve_knobs("zipar", {"window": 2, "tau": 0.5})
    with pytest.raises(ValueError, match=r"method 'lantern' needs knob\(s\) \['delta', 'draft_len', 'k'\]"):
        resolve_knobs("lantern", {})
    with pytest.raises(ValueError, match=r"knob r must be one of \(2, 4\)"):
        resolve_knobs("mulo", {"r": 3, "tau": 0.5, "k": 0})
    with pytest.raises(
        ValueError, match=r"knob upsampler must be one of \('latent', 'pixel'\), got 'bicubic'"
    ):
        resolve_knobs("mulo", {"r": 2, "tau": 0.5, "k": 0, "upsampler": "bicubic"})


def test_decode_cli_bad_method_and_knob(testbed, tmp_path):
    with pytest.raises(ValueError, match=r"unknown decoding method 'greedy'"):
        run(compose("decode", tmp_path, ["method=greedy", f"models={testbed}"]))
    with pytest.raises(ValueError, match=r"method 'mulo' needs knob\(s\) \['k', 'r', 'tau'\]"):
        run(compose("decode", tmp_path, ["method=mulo", f"models={testbed}"]))
    with pytest.raises(ValueError, match=r"unknown knob\(s\) \['delta'\] for method 'ar'"):
        run(compose("decode", tmp_path, ["method=ar", "knobs.delta=0.4", f"models={testbed}"]))
    with pytest.raises(ValueError, match=r"tau must lie in \[0, 1\]"):  # range checks: the method's own
        run(compose("decode", tmp_path, ["method=mulo", "knobs.r=2", "knobs.tau=2", "knobs.k=0",
                                         f"models={testbed}"]))  # fmt: skip


def test_missing_model_names_the_training_command(tmp_path):
    folder = save_tiny_testbed(tmp_path / "testbed", skip=("drafter_r4",))
    with pytest.raises(FileNotFoundError) as error:
        run(compose("decode", tmp_path, ["method=mulo", "knobs.r=4", "knobs.tau=0.5", "knobs.k=0",
                                         f"models={folder}"]))  # fmt: skip
    message = str(error.value)
    assert "testbed model 'drafter_r4' not found" in message
    assert f"mulo-train experiment=testbed/drafter_r4 export={folder.resolve() / 'drafter_r4'}" in message
    models = load_models(folder)  # names=None: whatever exists, no error
    assert "drafter_r4" not in models.drafters and models.drafters["drafter_r2"].grid_size == (4, 4)
    with pytest.raises(FileNotFoundError, match=r"mulo-train experiment=testbed/drafter_r4 export="):
        models.require("drafter_r4")
