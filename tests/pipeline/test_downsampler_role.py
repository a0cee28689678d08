"""The down-sampler role is loaded and required only by the MuLo-SD modes that call it (rejection='raster', a
rows_per_cycle): a set without one decodes every other mode token for token as a set with one; a mode that
needs it fails before anything loads, naming the role and how to train it."""

from __future__ import annotations

import pytest
import torch

from mulo_sd.pipeline import ModelSet, MuLoPipeline, required_models
from tests.training.test_decode_cli import PROMPT, save_tiny_testbed

NO_DOWNSAMPLERS = ("downsampler_r2", "downsampler_r4")
# knobs of the modes that decode in one cycle over the whole grid, never down-sampling
ONE_CYCLE = [{"tau": 0.1}, {"rejection": "naive"}, {"l": 1, "refresh_after_resample": True}, {"r": 4}]
PARTIAL = [{"rejection": "raster"}, {"rows_per_cycle": 1}, {"r": 4, "rejection": "raster"}]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """(a tiny testbed, the same models without down-samplers)."""
    root = tmp_path_factory.mktemp("sets")
    return save_tiny_testbed(root / "full"), save_tiny_testbed(root / "lacking", skip=NO_DOWNSAMPLERS)


def test_only_the_modes_that_call_it_require_the_downsampler():
    assert required_models("mulo", {}) == ["vq", "target", "drafter_r2", "upsampler_r2"]
    assert required_models("mulo", {"rejection": "naive", "r": 4})[-1] == "upsampler_r4"
    assert required_models("mulo", {"rejection": "raster"})[-1] == "downsampler_r2"
    assert required_models("mulo", {"rows_per_cycle": 2, "r": 4})[-1] == "downsampler_r4"
    assert "downsampler_r2" not in required_models("mulo", {"rejection": "raster", "downsampler": "pixel"})


@pytest.mark.parametrize("knobs", ONE_CYCLE)
def test_a_set_without_a_downsampler_decodes_the_modes_that_never_call_it(folders, knobs):
    full, lacking = (MuLoPipeline.from_pretrained(folder) for folder in folders)
    expected, out = full(PROMPT, "mulo", seed=2, **knobs), lacking(PROMPT, "mulo", seed=2, **knobs)
    assert torch.equal(out.tokens, expected.tokens) and out.stats[0].tokens_rejected > 0
    assert out.stats[0].downsampler_calls == expected.stats[0].downsampler_calls == 0
    assert not set(NO_DOWNSAMPLERS) & set(full.models.samplers)  # the full set loads none either


@pytest.mark.parametrize("knobs", PARTIAL)
def test_a_mode_that_calls_it_fails_before_loading_naming_the_role_and_its_training(folders, knobs):
    full, lacking = folders
    role = f"downsampler_r{knobs.get('r', 2)}"
    assert MuLoPipeline.from_pretrained(full)(PROMPT, "mulo", seed=2, **knobs).stats[0].downsampler_calls > 0
    pipe = MuLoPipeline.from_pretrained(lacking)
    with pytest.raises(FileNotFoundError) as error:
        pipe(PROMPT, "mulo", **knobs)
    assert f"testbed model '{role}' not found" in str(error.value)
    assert f"mulo-train experiment=testbed/{role} export=" in str(error.value)
    assert pipe.models is None
    unnamed = MuLoPipeline.from_pretrained(lacking, **{role: None})
    with pytest.raises(FileNotFoundError, match=rf"has no {role} folder \(MuLo-SD with rejection=raster"):
        unnamed(PROMPT, "mulo", **knobs)
    assert unnamed.models is None


def test_the_pixel_downsampler_serves_those_modes_without_a_trained_one(folders):
    pipe = MuLoPipeline.from_pretrained(folders[1])
    out = pipe(PROMPT, "mulo", seed=2, rejection="raster", downsampler="pixel")
    assert out.stats[0].downsampler_calls > 0


@pytest.mark.parametrize("family", ["llamagen", "tar"])
def test_a_real_familys_set_names_the_experiment_that_trains_it(folders, family):
    roles = ("vq", "target", "drafter_r2", "upsampler_r2")
    model_set = ModelSet(name="mine", family=family, folders={role: folders[1] / role for role in roles})
    pipe = MuLoPipeline(model_set)
    assert pipe.roles("mulo", {"rejection": "naive"}) == list(roles)
    with pytest.raises(FileNotFoundError) as error:
        pipe.roles("mulo", {"rejection": "raster"})
    assert "model set 'mine' has no downsampler_r2 folder (MuLo-SD with rejection=raster" in str(error.value)
    assert f"train it: mulo-train experiment={family}/downsampler_r2 {family}.root=" in str(error.value)
