"""`MuLoPipeline` on a testbed-layout folder: the low-level path's tokens exactly, only the models a method
needs, knob, folder, device and dtype errors, and `mulo_sd`'s lazy names."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
import tomllib
import torch

import mulo_sd
from mulo_sd.decoding.sampling import SamplerConfig
from mulo_sd.decoding.stats import COUNTS
from mulo_sd.pipeline import MuLoPipeline, decode, load_models, required_models, tensor_to_pil
from tests.training.test_decode_cli import PROMPT, save_tiny_testbed

PROMPTS = [PROMPT, "a green hexagon on a noisy background"]
# knobs each method decodes the tiny testbed with (its 32-code book: LANTERN pools fewer than 64)
METHODS = {
    "ar": {},
    "zipar": {"window": 2},
    "lantern": {"k": 4},
    "eagle2": {"depth": 2, "total_tokens": 6},
    "mulo": {"tau": 0.1},
    "mulo4": {"r": 4, "tau": 0.2, "upsampler": "pixel"},
}
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def testbed(tmp_path_factory) -> Path:
    return save_tiny_testbed(tmp_path_factory.mktemp("testbed"))


def counts(stats) -> dict:
    return {name: getattr(stats, name) for name in COUNTS} | {"islands": stats.island_sizes}


@pytest.mark.parametrize("case", list(METHODS))
def test_a_decode_is_the_low_level_paths_token_for_token(testbed, case):
    method, knobs = case.removesuffix("4"), METHODS[case]
    out = MuLoPipeline.from_pretrained(testbed)(PROMPTS, method, seed=3, **knobs)
    models = load_models(testbed, names=required_models(method, knobs))
    assert out.tokens.shape == (2, 8, 8) and out.tokens.dtype == torch.int64
    for i, prompt in enumerate(PROMPTS):  # each prompt alone, under the set's sampler (cfg 2)
        low = decode(method, models, [prompt], knobs, SamplerConfig(cfg_scale=2.0), seed=3)
        assert torch.equal(out.tokens[i : i + 1], low.tokens)
        assert out.images[i].tobytes() == tensor_to_pil(low.image[0]).tobytes()
        assert counts(out.stats[i]) == counts(low.stats)
        assert out.rows[i]["target_forwards"] == low.stats.target_forwards


def test_seeds_per_prompt_and_the_sampler(testbed):
    pipe = MuLoPipeline.from_pretrained(testbed)
    both = pipe([PROMPT, PROMPT], "ar", seed=[1, 2])
    assert torch.equal(both.tokens[:1], pipe(PROMPT, "ar", seed=1).tokens)
    assert not torch.equal(both.tokens[0], both.tokens[1])
    greedy = pipe(PROMPT, "ar", seed=1, sampler={"temperature": 0.0})  # over the set's sampler (cfg 2)
    again = pipe(PROMPT, "ar", seed=2, sampler=SamplerConfig(temperature=0.0, cfg_scale=2.0))
    assert torch.equal(greedy.tokens, again.tokens)
    with pytest.raises(ValueError, match=r"3 seeds for 2 prompts: give one seed or one per prompt"):
        pipe([PROMPT, PROMPT], "ar", seed=[1, 2, 3])
    with pytest.raises(ValueError, match=r"prompts must be a caption or a non-empty list of captions, got"):
        pipe([], "ar")


def test_only_the_models_the_method_needs_load_and_stay_loaded(testbed):
    pipe = MuLoPipeline.from_pretrained(testbed)
    assert pipe.models is None  # naming the set reads configs only
    pipe(PROMPT, "ar")
    loaded = pipe.models
    assert (loaded.tokenizer, loaded.target) != (None, None) and not loaded.drafters and not loaded.samplers
    pipe(PROMPT, "zipar")
    assert pipe.models is loaded  # nothing more to load
    pipe(PROMPT, "mulo", r=4, upsampler="pixel")
    assert set(pipe.models.drafters) == {"drafter_r4"} and not pipe.models.samplers
    assert "loaded=['vq', 'target', 'drafter_r4']" in repr(pipe)


def test_an_unknown_knob_is_named_with_the_methods_knobs_before_anything_loads(testbed):
    pipe = MuLoPipeline.from_pretrained(testbed)
    unknown = r"unknown knob\(s\) \['taux'\] for method 'mulo'; it takes \[.*'rejection', .*'tau'"
    with pytest.raises(ValueError, match=unknown):
        pipe(PROMPT, "mulo", taux=0.1)
    with pytest.raises(ValueError, match=r"unknown knob\(s\) \['window'\] for method 'ar'; it takes \[\]"):
        pipe(PROMPT, "ar", window=2)
    with pytest.raises(ValueError, match=r"unknown decoding method 'beam'; choose one of"):
        pipe(PROMPT, "beam")
    assert pipe.models is None


def test_device_and_dtype(testbed):
    pipe = MuLoPipeline.from_pretrained(testbed, device=torch.device("cpu"), dtype=torch.bfloat16)
    assert pipe.model_set.dtype == "bfloat16"
    out = pipe(PROMPT, "ar")
    assert pipe.models.target.output.weight.dtype == torch.bfloat16  # the GPTs in bf16, the VQ in float32
    assert pipe.models.tokenizer.codebook.dtype == torch.float32 and out.tokens.device.type == "cpu"
    assert MuLoPipeline.from_pretrained(testbed, dtype="fp16").model_set.dtype == "fp16"
    with pytest.raises(ValueError, match=r"dtype must be one of .* or a torch.dtype, got 'int8'"):
        MuLoPipeline.from_pretrained(testbed, dtype="int8")
    cuda = MuLoPipeline.from_pretrained(testbed, device="cuda")
    if torch.cuda.is_available():
        cuda(PROMPT, "ar")
        assert cuda.models.target.output.weight.device.type == "cuda"
    else:
        with pytest.raises(ValueError, match=r"loads on cuda, but this machine has no CUDA device"):
            cuda(PROMPT, "ar")


def test_a_missing_model_folder_names_what_to_put_where(tmp_path):
    folder = save_tiny_testbed(tmp_path / "testbed", skip=("drafter_r4",))
    pipe = MuLoPipeline.from_pretrained(folder)
    with pytest.raises(FileNotFoundError) as error:
        pipe(PROMPT, "mulo", r=4, upsampler="pixel")
    message = str(error.value)
    assert f"testbed model 'drafter_r4' not found in {folder / 'drafter_r4'}" in message
    assert f"mulo-train experiment=testbed/drafter_r4 export={folder.resolve() / 'drafter_r4'}" in message
    assert pipe.models is None  # checked before anything loads
    with pytest.raises(FileNotFoundError, match=r"'upsampler_r2' not found in .*elsewhere: train and export"):
        MuLoPipeline.from_pretrained(folder, upsampler_r2=tmp_path / "elsewhere")(PROMPT, "mulo")
    with pytest.raises(ValueError, match=r"unknown role\(s\) \['drafter_r3'\] in folders; known:"):
        MuLoPipeline.from_pretrained(folder, drafter_r3="drafter_r2")
    with pytest.raises(ValueError, match=r"keeps its models under a folder you give: .*\('tar_1024', root="):
        MuLoPipeline.from_pretrained("tar_1024")
    with pytest.raises(FileNotFoundError, match=r"model 'target' not found in .*nowhere: train and"):
        MuLoPipeline.from_pretrained(folder, target=tmp_path / "nowhere")


def test_mulo_sd_has_its_version_and_the_pipeline_without_importing_it_up_front(monkeypatch):
    check = "import sys, mulo_sd.nets; print(sorted(m for m in sys.modules if m.startswith('mulo_sd.pip')))"
    result = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, cwd=ROOT)
    assert result.stdout.strip() == "[]"
    from mulo_sd import MuLoPipeline as lazy

    assert lazy is MuLoPipeline and "MuLoPipeline" in dir(mulo_sd)
    assert mulo_sd.__version__ == metadata.version("mulo-sd")

    def not_installed(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", not_installed)
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert mulo_sd.package_version() == pyproject["project"]["version"]
    with pytest.raises(AttributeError, match=r"module 'mulo_sd' has no attribute 'Pipeline'"):
        mulo_sd.Pipeline  # noqa: B018
