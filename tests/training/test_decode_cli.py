import os
import re
from pathlib import Path

import hydra
import pytest
import torch
import yaml
from hydra.core.hydra_config import HydraConfig
from mulo_sd.training.config import CONFIG_DIR
from mulo_sd.training.decode import run
from omegaconf import DictConfig, open_dict
from PIL import Image

from mulo_sd.decoding.sampling import SamplerConfig
from mulo_sd.nets.downsampler import Downsampler, DownsamplerConfig
from mulo_sd.nets.eagle_head import EagleHead, EagleHeadConfig
from mulo_sd.nets.gpt import GPT
from mulo_sd.nets.gpt_config import GPTConfig
from mulo_sd.nets.upsampler import Upsampler, UpsamplerConfig
from mulo_sd.nets.vq import VQModel
from mulo_sd.nets.vq_config import VQConfig
from mulo_sd.pipeline import mulo_pipeline
from mulo_sd.pipeline.decode_entry import (
    RECOMMENDED,
    caption_condition,
    decode,
    method_knobs,
    required_models,
    resolve_knobs,
)
from mulo_sd.pipeline.testbed_models import MODEL_CLASSES, load_models
from mulo_sd.testbed.captions import MAX_CAPTION_WORDS, VOCAB
from mulo_sd.testbed.sceneeval import SceneEval, SceneEvalConfig

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
    models["eagle_head"] = EagleHead(EagleHeadConfig.for_target(models["target"].config))
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


def at(folder: Path) -> list[str]:
    """The overrides that point an entry point at a folder in the testbed layout (conf/models/folder.yaml)."""
    return ["models=folder", f"models.root={folder}"]


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
    cfg = compose("decode", tmp_path, ["method=zipar", "knobs.window=2", *at(testbed), f"out={out}"])
    stats = run(cfg)
    image = Image.open(out)
    assert image.size == (16, 16) and image.mode == "RGB"
    assert stats["target_forwards"] == 8 + 7 * 2  # ZipAR: w + (h - 1) * W
    assert stats["sequential_steps"] == stats["target_forwards"] and stats["wall_s"] > 0


def test_decode_cli_default_output_goes_to_run_dir(testbed, tmp_path):
    cfg = compose("decode", tmp_path, ["method=mulo", "knobs.r=4", "knobs.tau=0.2", "knobs.k=2",
                                       "knobs.upsampler=pixel", *at(testbed)])  # fmt: skip
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


def test_eagle2_with_greedy_equals_ar(testbed):
    models = load_models(testbed, names=["vq", "target", "eagle_head"])
    greedy = SamplerConfig(temperature=0.0, cfg_scale=2.0)
    ar = decode("ar", models, [PROMPT], {}, greedy, seed=0)
    eagle = decode("eagle2", models, [PROMPT], {"depth": 3, "top_k": 2, "total_tokens": 5}, greedy, seed=1)
    assert torch.equal(ar.tokens, eagle.tokens) and eagle.stats.cycles > 0
    assert required_models("eagle2", {}) == ["vq", "target", "eagle_head"]


def test_knobs_are_validated_with_clear_errors(monkeypatch):
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
    monkeypatch.setitem(RECOMMENDED, "lantern", {})  # the function's own signature: no defaults for these
    with pytest.raises(ValueError, match=r"method 'lantern' needs knob\(s\) \['delta', 'draft_len', 'k'\]"):
        resolve_knobs("lantern", {})
    with pytest.raises(ValueError, match=r"knob r must be one of \(2, 4\)"):
        resolve_knobs("mulo", {"r": 3, "tau": 0.5, "k": 0})
    with pytest.raises(
        ValueError, match=r"knob upsampler must be one of \('latent', 'pixel'\), got 'bicubic'"
    ):
        resolve_knobs("mulo", {"r": 2, "tau": 0.5, "k": 0, "upsampler": "bicubic"})
    with pytest.raises(ValueError, match=r"knob rejection must be one of \('local', 'naive', 'raster'\)"):
        resolve_knobs("mulo", {"rejection": "greedy"})


def test_recommended_knobs_are_the_defaults():
    assert resolve_knobs("mulo", {}) == {
        "r": 2, "upsampler": "latent", "downsampler": "latent", "pixel_mode": "bicubic", "tau": 0.02,
        "accept_rule": "typical", "accept_floor": 0.0, "k": 4, "l": 0, "rejection": "local",
        "rows_per_cycle": None, "draft_window": 1, "island_zipar_window": 1, "refresh_after_resample": False,
        "parallel": True, "drafter_cfg_scale": None, "draft_temperature": None,
    }  # fmt: skip
    assert resolve_knobs("lantern", {}) == {"k": 64, "delta": 0.4, "draft_len": 4}
    assert resolve_knobs("zipar", {}) == {"window": 4}
    assert resolve_knobs("mulo", {"tau": 0.2, "r": 4}) == {**resolve_knobs("mulo", {}), "tau": 0.2, "r": 4}
    assert required_models("mulo", {}) == ["vq", "target", "drafter_r2", "upsampler_r2"]  # one cycle: no D_r


# a knob line of conf/decode/default.yaml: "  k: default  # lantern (64), mulo (4): ..."
KNOB_LINE = re.compile(r"  (\w+): default  # ((?:\w+ \([^)]*\)(?:, )?)+):")


def test_decode_config_documents_the_defaults():
    """conf/decode/default.yaml states each knob's default as `# method (value)`: it must be the real one."""
    documented = {}
    for line in (CONFIG_DIR / "decode" / "default.yaml").read_text().splitlines():
        knob = KNOB_LINE.match(line)
        for method, text in re.findall(r"(\w+) \(([^)]*)\)", knob.group(2)) if knob else []:
            documented[method, knob.group(1)] = yaml.safe_load(text.split(":")[0])
    expected = {(m, k): v for m in ("zipar", "lantern", "eagle2", "mulo") for k, v in method_knobs(m).items()}
    assert documented == expected


# (knobs, the error): a knob the chosen mode ignores, set explicitly
IGNORED_KNOBS = [
    ({"rejection": "raster", "l": 1}, r"knob l does not apply with rejection='raster'"),
    ({"rejection": "naive", "l": 0}, r"knob l does not apply with rejection='naive'"),
    ({"rejection": "raster", "island_zipar_window": 2}, r"knob island_zipar_window does not apply with rej"),
    ({"rejection": "raster", "refresh_after_resample": True}, r"knob refresh_after_resample does not apply"),
    ({"rejection": "raster", "parallel": False}, r"knob parallel does not apply with rejection='raster'"),
    ({"pixel_mode": "bilinear"}, r"knob pixel_mode does not apply with upsampler='latent'"),
    ({"upsampler": "latent", "downsampler": "pixel", "pixel_mode": "lanczos"}, r"knob pixel_mode does not"),
    ({"upsampler": "pixel", "draft_temperature": 0.5}, r"knob draft_temperature does not apply"),
]  # fmt: skip


@pytest.mark.parametrize(("knobs", "error"), IGNORED_KNOBS)
def test_a_knob_the_mode_ignores_is_an_error_when_set(knobs, error):
    with pytest.raises(ValueError, match=error):
        resolve_knobs("mulo", knobs)


def test_knobs_that_apply_or_keep_their_defaults_are_accepted():
    raster = resolve_knobs("mulo", {"rejection": "raster"})  # l, island_zipar_window: defaults, not set
    assert raster["l"] == 0 and raster["island_zipar_window"] == 1
    assert resolve_knobs("mulo", {"rejection": "naive", "island_zipar_window": 2, "parallel": False})
    assert resolve_knobs("mulo", {"rejection": "local", "l": 2, "refresh_after_resample": True})["l"] == 2
    assert resolve_knobs("mulo", {"upsampler": "pixel", "pixel_mode": "lanczos"})["downsampler"] == "pixel"


def test_decode_cli_bad_method_and_knob(testbed, tmp_path):
    with pytest.raises(ValueError, match=r"unknown decoding method 'greedy'"):
        run(compose("decode", tmp_path, ["method=greedy", *at(testbed)]))
    with pytest.raises(ValueError, match=r"unknown knob\(s\) \['delta'\] for method 'ar'"):
        run(compose("decode", tmp_path, ["method=ar", "knobs.delta=0.4", *at(testbed)]))
    with pytest.raises(ValueError, match=r"knob l does not apply with rejection='raster'"):
        run(compose("decode", tmp_path, ["method=mulo", "knobs.rejection=raster", "knobs.l=1",
                                         *at(testbed)]))  # fmt: skip
    with pytest.raises(ValueError, match=r"tau must lie in \[0, 1\]"):  # range checks: the method's own
        run(compose("decode", tmp_path, ["method=mulo", "knobs.r=2", "knobs.tau=2", "knobs.k=0",
                                         *at(testbed)]))  # fmt: skip


class Stop(Exception):
    """Raised by a stand-in for `decode` once the call it was given has been recorded."""


def stop(*args, **kwargs):
    raise Stop


def test_decode_cli_knobs_keep_their_defaults_until_set_and_null_is_none(testbed, tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(mulo_pipeline, "required_models", lambda method, knobs: seen.append(knobs) or [])
    monkeypatch.setattr(mulo_pipeline, "decode", stop)
    for overrides in (["knobs.tau=0.2"], ["knobs.draft_window=null", "knobs.island_zipar_window=null"]):
        with pytest.raises(Stop):
            run(compose("decode", tmp_path, ["method=mulo", *at(testbed), *overrides]))
    assert seen == [{"tau": 0.2}, {"draft_window": None, "island_zipar_window": None}]
    monkeypatch.undo()
    with pytest.raises(ValueError, match=r"knob\(s\) \['tau'\] of method 'mulo' cannot be null \(only \["):
        run(compose("decode", tmp_path, ["method=mulo", "knobs.tau=null", *at(testbed)]))


@pytest.mark.parametrize("method", ["mulo", "lantern"])
def test_decode_cli_runs_the_committed_testbed_without_knobs(method, tmp_path):
    out = tmp_path / "sample.png"
    prompt = "prompt=a red circle on a striped background"
    stats = run(compose("decode", tmp_path, [f"method={method}", prompt, f"out={out}", "threads=1"]))
    assert Image.open(out).size == (128, 128)
    assert stats["tokens_accepted"] + stats["tokens_resampled"] == 256  # every position exactly once
    assert stats["drafter_forwards"] > 1 and stats["tokens_accepted"] > 0
    if method == "mulo":  # the set's two cycles of 4 low-res rows, each a window-1 diagonal of 4 + 7 calls
        assert stats["upsampler_calls"] == stats["cycles"] == 2 and stats["downsampler_calls"] == 1
        assert stats["drafter_forwards"] == 2 * (4 + 7)  # the first cycle's first call is the drafter's start


@pytest.fixture
def no_decoding(monkeypatch):
    """Loading models or decoding fails the test: the errors below must come first."""

    def fail(*args, **kwargs):
        raise AssertionError("a model was loaded or decoded before the input was checked")

    monkeypatch.setattr(mulo_pipeline, "load_model_set", fail)
    monkeypatch.setattr(mulo_pipeline, "decode", fail)


@pytest.mark.parametrize("prompt", ["''", "'   '", "'\t'"])
def test_an_empty_prompt_is_an_error_before_decoding(prompt, no_decoding, tmp_path):
    with pytest.raises(ValueError, match=r"prompt is empty .*or ask for an unconditional sample with "):
        run(compose("decode", tmp_path, [f"prompt={prompt}"]))


def test_an_unknown_word_is_an_error_before_decoding(no_decoding, tmp_path):
    with pytest.raises(ValueError, match=r"word 'elephant' is not in the caption vocabulary"):
        run(compose("decode", tmp_path, ["prompt='a purple elephant'"]))


def test_unconditional_takes_an_empty_prompt_and_samples_the_null_caption(testbed, tmp_path, monkeypatch):
    with pytest.raises(ValueError, match=r"unconditional=true samples without a caption, but prompt="):
        run(compose("decode", tmp_path, ["unconditional=true", *at(testbed)]))
    seen = []
    monkeypatch.setattr(mulo_pipeline, "decode", lambda *args, **kwargs: stop(seen.append((args, kwargs))))
    for compile in ("false", "true"):  # compile=true reaches decode (docs/usage.md)
        with pytest.raises(Stop):
            run(
                compose(
                    "decode",
                    tmp_path,
                    ["unconditional=true", "prompt=''", f"compile={compile}", *at(testbed)],
                )
            )
    (method, _, prompts, _, sampler, _), _ = seen[0]
    assert method == "ar" and prompts == [""] and sampler.cfg_scale == 0.0
    assert [kwargs for _, kwargs in seen] == [{"compile": False}, {"compile": True}]
    # guidance at scale 0 leaves the unconditional branch alone: the prefix the caption dropout trained
    target = load_models(testbed, names=["target"]).target
    cond = caption_condition(target, [""])
    null = target(torch.zeros(1, 64, dtype=torch.long), cond, drop=torch.ones(1, dtype=torch.bool))[:, 0]
    torch.testing.assert_close(target.start(cond, cfg_scale=0.0).first_logits, null)
    assert not torch.allclose(target.start(cond, cfg_scale=1.0).first_logits, null)


@pytest.mark.parametrize(
    ("out", "error"),
    [
        ("{tmp}", r"is an existing directory: give an image file, e.g. out=.*sample.png"),
        ("{tmp}/sample", r"must end in one of \['.png', '.jpg', '.jpeg'\]"),
        ("{tmp}/sample.gif", r"must end in one of"),
        ("{tmp}/file.txt/deeper/sample.png", r"its folder .*deeper cannot be created: .*file.txt is a file"),
    ],
)
def test_a_bad_output_path_is_an_error_before_decoding(out, error, no_decoding, tmp_path):
    (tmp_path / "file.txt").write_text("a file where a folder should be")
    with pytest.raises(ValueError, match=error):
        run(compose("decode", tmp_path, [f"out={out.format(tmp=tmp_path)}"]))


def test_a_jpg_output_is_written_into_a_new_folder(testbed, tmp_path):
    out = tmp_path / "new" / "folder" / "sample.JPG"
    run(compose("decode", tmp_path, [*at(testbed), f"out={out}"]))
    assert Image.open(out).format == "JPEG"


def test_missing_model_names_the_training_command(tmp_path):
    folder = save_tiny_testbed(tmp_path / "testbed", skip=("drafter_r4",))
    with pytest.raises(FileNotFoundError) as error:
        run(compose("decode", tmp_path, ["method=mulo", "knobs.r=4", "knobs.tau=0.5", "knobs.k=0",
                                         *at(folder)]))  # fmt: skip
    message = str(error.value)
    assert "testbed model 'drafter_r4' not found" in message
    assert f"mulo-train experiment=testbed/drafter_r4 export={folder.resolve() / 'drafter_r4'}" in message
    models = load_models(folder)  # names=None: whatever exists, no error
    assert "drafter_r4" not in models.drafters and models.drafters["drafter_r2"].grid_size == (4, 4)
    with pytest.raises(FileNotFoundError, match=r"mulo-train experiment=testbed/drafter_r4 export="):
        models.require("drafter_r4")
