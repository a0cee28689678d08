"""Model folders (config.json + model.safetensors) that do not fit together, or do not read, fail with an
error naming the file and the field: copies of the committed testbed models, corrupted one way each."""

import dataclasses
import json
import shutil

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from mulo_sd.nets.gpt import GPT
from mulo_sd.nets.io import CONFIG_KEY, CONFIG_NAME, WEIGHTS_NAME, ModelFileError
from mulo_sd.nets.upsampler import Upsampler
from mulo_sd.pipeline.testbed_models import MODEL_CLASSES, TESTBED_DIR
from mulo_sd.testbed.sceneeval import SceneEval


def copy_model(tmp_path, name: str, without_metadata: bool = False):
    """A copy of committed testbed model `name`; `without_metadata`: as a file exported before the config
    was stored in the weights."""
    folder = shutil.copytree(TESTBED_DIR / name, tmp_path / name)
    if without_metadata:
        save_file(load_file(folder / WEIGHTS_NAME), str(folder / WEIGHTS_NAME))
    return folder


def edit_config(folder, **fields) -> None:
    config = json.loads((folder / CONFIG_NAME).read_text())
    config.update(fields)
    (folder / CONFIG_NAME).write_text(json.dumps(config, indent=2))


def load_error(cls, folder) -> str:
    with pytest.raises(ModelFileError) as error:
        cls.from_pretrained(folder)
    return str(error.value)


def test_every_committed_model_stores_its_config_and_resaves_to_the_same_tensors(tmp_path):
    for name, cls in MODEL_CLASSES.items():
        path = TESTBED_DIR / name / WEIGHTS_NAME
        with safe_open(str(path), "pt") as file:
            stored = json.loads(file.metadata()[CONFIG_KEY])
        assert stored == {**stored, **json.loads((TESTBED_DIR / name / CONFIG_NAME).read_text())}, name
        resaved = cls.from_pretrained(TESTBED_DIR / name).save_pretrained(tmp_path / name) / WEIGHTS_NAME
        original, again = load_file(path), load_file(resaved)
        assert original.keys() == again.keys(), name
        for key, tensor in original.items():
            assert again[key].dtype == tensor.dtype and torch.equal(again[key], tensor), (name, key)
        with safe_open(str(resaved), "pt") as file:
            written = json.loads(file.metadata()[CONFIG_KEY])
        assert written == {**written, **stored}, name  # every stored field kept
        defaults = {field.name: field.default for field in dataclasses.fields(cls.config_class)}
        added = {key: written[key] for key in written.keys() - stored.keys()}
        assert added == {key: defaults[key] for key in added}, name  # fields newer than the file: defaults


def test_every_shipped_ablation_model_loads_for_the_testbed_tokenizer():
    """The folders under ablation/ that the presets and the README name: each loads, each up-sampler was
    trained for the testbed VQ's codebook, and the latent-distilled ones draft from a code, not row-causal."""
    vq = MODEL_CLASSES["vq"].from_pretrained(TESTBED_DIR / "vq")
    upsamplers = sorted((TESTBED_DIR / "ablation").glob("upsampler_r*"))
    names = {folder.name for folder in upsamplers}
    assert {"upsampler_r2_latent_distilled", "upsampler_r4_latent_distilled"} <= names
    for folder in upsamplers:
        sampler = Upsampler.from_pretrained(folder)
        sampler.check_tokenizer(vq)
        assert sampler.r == int(folder.name[len("upsampler_r")]), folder.name
        if folder.name.endswith("_latent_distilled"):
            assert (sampler.config.output, sampler.config.causal) == ("code", False), folder.name
    for r in (2, 4):
        MODEL_CLASSES[f"drafter_r{r}"].from_pretrained(TESTBED_DIR / "ablation" / f"drafter_r{r}_from_target")


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"n_head": 3}, "n_head is 3 in config.json, saved as 6"),
        ({"grid_size": [8, 8]}, "grid_size is [8, 8] in config.json, saved as [16, 16]"),
        ({"word_positions": False}, "word_positions is false in config.json, saved as true"),
    ],
)
def test_a_config_edit_that_changes_no_shape_is_caught_by_the_stored_config(tmp_path, fields, message):
    folder = copy_model(tmp_path, "target")
    edit_config(folder, **fields)
    error = load_error(GPT, folder)
    assert f"{folder / CONFIG_NAME} does not match the config {folder / WEIGHTS_NAME} was saved with" in error
    assert f"field(s) {list(fields)}" in error and message in error


def test_sceneeval_image_size_is_checked_against_the_stored_config(tmp_path):
    folder = copy_model(tmp_path, "sceneeval")
    edit_config(folder, image_size=64)
    assert "image_size is 64 in config.json, saved as 128" in load_error(SceneEval, folder)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            '{"kind": "gpt", "dim": 192\n "n_head": 6}',
            "invalid JSON at line 2, column 2: Expecting ',' delimiter",
        ),
        ("[1, 2]", "expected a JSON object of config fields, got list"),
    ],
)
def test_invalid_json_names_the_file_and_line(tmp_path, text, message):
    folder = copy_model(tmp_path, "target")
    (folder / CONFIG_NAME).write_text(text)
    assert load_error(GPT, folder) == f"{folder / CONFIG_NAME}: {message}"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"n_head": "6"}, "field 'n_head' must be an integer, got \"6\""),
        ({"n_head": 6.0}, "field 'n_head' must be an integer, got 6.0"),
        ({"grid_size": 16}, "field 'grid_size' must be a list [an integer, an integer], got 16"),
        (
            {"grid_size": [16, 16, 1]},
            "field 'grid_size' must be a list [an integer, an integer], got [16, 16, 1]",
        ),
        ({"n_kv_head": "all"}, "field 'n_kv_head' must be an integer or null, got \"all\""),
        ({"word_positions": 1}, "field 'word_positions' must be true or false, got 1"),
        ({"n_heads": 6}, "unknown GPTConfig field(s) ['n_heads']"),
        ({"n_head": 7}, "dim 192 is not divisible by n_head 7"),
        ({"kind": "vq"}, "field 'kind' says it holds a 'vq' model, not a 'gpt' model"),
    ],
)
def test_a_bad_config_field_names_the_file_and_the_field(tmp_path, fields, message):
    folder = copy_model(tmp_path, "target")
    edit_config(folder, **fields)
    assert load_error(GPT, folder).startswith(f"{folder / CONFIG_NAME}: {message}")


def test_a_missing_required_field_is_named(tmp_path):
    folder = copy_model(tmp_path, "upsampler_r2")
    config = json.loads((folder / CONFIG_NAME).read_text())
    del config["r"], config["code_dim"]
    (folder / CONFIG_NAME).write_text(json.dumps(config))
    error = load_error(Upsampler, folder)
    assert error == f"{folder / CONFIG_NAME}: missing required UpsamplerConfig field(s) ['code_dim', 'r']"


def test_a_missing_field_with_a_default_takes_it(tmp_path):
    folder = copy_model(tmp_path, "drafter_small")  # its config.json predates prefix_rotation
    assert "prefix_rotation" not in json.loads((folder / CONFIG_NAME).read_text())
    assert GPT.from_pretrained(folder).config.prefix_rotation == "zero"


@pytest.mark.parametrize(
    ("fields", "line"),
    [
        (
            {"dim": 64},
            "tensor 'layers.0.attention.wo.weight': shape [128, 128] in the file, [64, 64] from the config "
            "(set by config field(s): dim)",
        ),
        (
            {"vocab_size": 512},
            "tensor 'output.weight': shape [1024, 128] in the file, [512, 128] from the config "
            "(set by config field(s): vocab_size, dim)",
        ),
        (
            {"n_layer": 1},
            "tensor 'layers.1.attention.wo.weight': in the file (shape [128, 128]), but not in the model "
            "of the config (set by config field(s): n_layer)",
        ),
        (
            {"word_positions": True},
            "tensor 'word_positions': missing from the file; the config implies shape [19, 128] "
            "(set by config field(s): cond_len, word_positions, caption_dim)",
        ),
    ],
)
def test_without_a_stored_config_a_shape_mismatch_names_tensor_shapes_and_fields(tmp_path, fields, line):
    folder = copy_model(tmp_path, "drafter_small", without_metadata=True)
    edit_config(folder, **fields)
    error = load_error(GPT, folder)
    assert error.startswith(f"{folder / WEIGHTS_NAME} does not fit the GPT of {folder / CONFIG_NAME}:\n")
    assert f"\n  {line}" in error


def test_a_weights_file_of_another_model_is_refused(tmp_path):
    folder = copy_model(tmp_path, "drafter_r2")
    shutil.copy(TESTBED_DIR / "drafter_r4" / WEIGHTS_NAME, folder / WEIGHTS_NAME)  # same shapes, 4x4 grid
    assert "grid_size is [8, 8] in config.json, saved as [4, 4]" in load_error(GPT, folder)


@pytest.mark.parametrize("keep", [0, 7, 100, -1000])
def test_a_truncated_or_corrupt_weights_file_is_named(tmp_path, keep):
    folder = copy_model(tmp_path, "upsampler_r2")
    data = (folder / WEIGHTS_NAME).read_bytes()
    (folder / WEIGHTS_NAME).write_bytes(data[:keep])
    error = load_error(Upsampler, folder)
    assert error.startswith(f"{folder / WEIGHTS_NAME}: not a complete safetensors file (")
    assert "it may be truncated or corrupt" in error


def test_a_garbled_stored_config_is_named(tmp_path):
    folder = copy_model(tmp_path, "upsampler_r2")
    save_file(load_file(folder / WEIGHTS_NAME), str(folder / WEIGHTS_NAME), metadata={CONFIG_KEY: "{oops"})
    assert load_error(Upsampler, folder).startswith(
        f"{folder / WEIGHTS_NAME} (metadata '{CONFIG_KEY}'): invalid"
    )
