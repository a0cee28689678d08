"""The shipped testbed set's own MuLo-SD knobs (conf/models/testbed.yaml): 4 low-res rows per cycle, so
r=2's 8x8 draft grid takes two cycles and r=4's 4x4 grid one, token for token the single-cycle decode."""

from __future__ import annotations

import pytest
import torch

from mulo_sd.pipeline import MuLoPipeline

PROMPT = "two red circles left of a blue star on a striped background"


@pytest.fixture(scope="module")
def pipeline() -> MuLoPipeline:
    return MuLoPipeline.from_pretrained()


def test_the_set_drafts_four_low_res_rows_per_cycle(pipeline):
    assert pipeline.method_knobs("mulo") == {"rows_per_cycle": 4}
    assert pipeline.method_knobs("mulo", {"rows_per_cycle": None}) == {"rows_per_cycle": None}
    assert "downsampler_r2" in pipeline.roles("mulo")  # the second cycle drafts from down-sampled rows
    assert "downsampler_r2" not in pipeline.roles("mulo", {"rows_per_cycle": None})


def test_r2_takes_two_cycles_and_null_restores_one(pipeline):
    default = pipeline(PROMPT, "mulo", seed=1)
    explicit = pipeline(PROMPT, "mulo", seed=1, rows_per_cycle=4)
    single = pipeline(PROMPT, "mulo", seed=1, rows_per_cycle=None)
    assert default.stats[0].cycles == 2 and single.stats[0].cycles == 1
    assert torch.equal(default.tokens, explicit.tokens)
    assert default.stats[0].drafter_forwards > single.stats[0].drafter_forwards  # a second diagonal of calls


def test_at_r4_the_grid_is_one_cycle_of_four_rows_token_for_token(pipeline):
    for seed in (0, 1):
        default = pipeline(PROMPT, "mulo", seed=seed, r=4)
        single = pipeline(PROMPT, "mulo", seed=seed, r=4, rows_per_cycle=None)
        assert default.stats[0].cycles == single.stats[0].cycles == 1
        assert torch.equal(default.tokens, single.tokens)
        assert default.stats[0].sequential_steps == single.stats[0].sequential_steps
