"""The 32x32-token testbed set (conf/models/testbed_256.yaml) loads by name, with the grids its roles need,
and decodes 256 px images with MuLo-SD, LANTERN and EAGLE-2; the roles it lacks are named."""

from __future__ import annotations

import pytest
import torch

from mulo_sd import MuLoPipeline
from mulo_sd.pipeline.folder_hints import export_command
from mulo_sd.pipeline.roles import TESTBED_DIR
from mulo_sd.pipeline.set_files import set_config

CAPTION = "two red circles left of a blue star on a striped background"


@pytest.fixture(scope="module")
def pipe():
    return MuLoPipeline.from_pretrained("testbed_256")


def test_the_set_pairs_the_32x32_target_with_the_16x16_and_8x8_drafters(pipe):
    folders = set_config("testbed_256")["folders"]
    models = pipe._load(["target", "drafter_r2", "drafter_r4", "upsampler_r2", "upsampler_r4"], True)
    grids = {role: models.require(role).grid_size for role in ("target", "drafter_r2", "drafter_r4")}
    assert grids == {"target": (32, 32), "drafter_r2": (16, 16), "drafter_r4": (8, 8)}
    assert (models.require("upsampler_r2").r, models.require("upsampler_r4").r) == (2, 4)
    # the r=2 drafter is the committed 16x16 target itself, the r=4 drafter the 8x8 drafter
    assert (folders["drafter_r2"], folders["drafter_r4"]) == ("target", "drafter_r2")
    testbed_target = MuLoPipeline.from_pretrained("testbed")._load(["target"], True).require("target")
    assert all(torch.equal(a, b) for a, b in zip(
        models.require("drafter_r2").state_dict().values(), testbed_target.state_dict().values(), strict=True
    ))  # fmt: skip


@pytest.mark.parametrize("r", [2, 4])
def test_mulo_decodes_a_256_px_image_in_a_fraction_of_ars_steps(pipe, r):
    out = pipe([CAPTION], method="mulo", seed=0, r=r)
    assert out.images[0].size == (256, 256) and tuple(out.tokens[0].shape) == (32, 32)
    assert out.stats[0].sequential_steps < 1024 / 8


def test_lantern_and_eagle2_draft_for_the_32x32_target_and_save_target_calls(pipe):
    models = pipe._load(["target", "drafter_small", "eagle_head"], True)
    target, drafter = models.require("target"), models.require("drafter_small")
    models.require("eagle_head").check_target(target)  # raises unless the head is the 32x32 target's
    assert drafter.grid_size == (32, 32)
    assert sum(p.numel() for p in drafter.parameters()) * 3 < sum(p.numel() for p in target.parameters())
    # drafts are accepted: fewer target calls than AR's one per token (measured: 262 and 719; EAGLE-2's
    # default depth 1 verifies one draft token per call, so it needs at least 512)
    for method, most_calls in (("lantern", 0.5 * 1024), ("eagle2", 0.85 * 1024)):
        out = pipe([CAPTION], method=method, seed=0)
        assert out.images[0].size == (256, 256) and tuple(out.tokens[0].shape) == (32, 32)
        assert out.stats[0].target_forwards < most_calls, method


def test_the_roles_it_lacks_are_named_with_the_command_that_makes_them(pipe):
    with pytest.raises(FileNotFoundError, match=r"'testbed_256' has no sr_x2 .*testbed/sr_x2"):
        pipe([CAPTION], method="mulo", seed=0, upsampler="pixel", pixel_mode="sr")
    with pytest.raises(FileNotFoundError, match=r"'testbed_256' has no downsampler_r2 folder"):
        pipe([CAPTION], method="mulo", seed=0, rejection="raster")
    # a folder named after an experiment of its own gets that experiment's command, not the role's
    command = export_command("upsampler_r4", TESTBED_DIR / "upsampler_r4_256")
    assert command.startswith("mulo-train experiment=testbed/upsampler_r4_256 export=")
    assert export_command("upsampler_r4", "/elsewhere/mine").startswith(
        "mulo-train experiment=testbed/upsampler_r4 "
    )


def test_lantern_defaults_to_the_delta_chosen_on_dev_prompts_at_this_size(pipe):
    default = pipe([CAPTION], method="lantern", seed=3).tokens[0]
    assert torch.equal(default, pipe([CAPTION], method="lantern", seed=3, delta=0.2).tokens[0])
    assert not torch.equal(default, pipe([CAPTION], method="lantern", seed=3, delta=0.4).tokens[0])
