"""The real-size cost model (mulo_sd/evaluation/cost_model.py): the call schedule DecodeStats records, the
exact AR / ZipAR schedules, the scaling rule, the timing interpolation, and (slow) the whole command at
--size tiny."""

from __future__ import annotations

import pytest
import torch

from mulo_sd.decoding.methods import decode_ar, zipar_target_forwards
from mulo_sd.decoding.methods.instrumented import DOWNSAMPLER, DRAFT_HEAD, UPSAMPLER, Recorded
from mulo_sd.decoding.sampling import SamplerConfig
from mulo_sd.decoding.stats import DecodeStats
from mulo_sd.evaluation.cost_model import PREDICTION_COLUMNS, main, run
from mulo_sd.evaluation.cost_schedules import (
    METHODS,
    ar_schedule,
    real_sets,
    scale_schedule,
    zipar_schedule,
)
from mulo_sd.evaluation.cost_timing import bucket_points, interpolate
from mulo_sd.nets.gpt import GPT
from mulo_sd.nets.gpt_config import GPTConfig


def tiny_gpt(grid=(4, 5)) -> GPT:
    config = GPTConfig(
        vocab_size=16, grid_size=grid, dim=16, n_layer=1, n_head=2, cond_type="class", cond_len=1,
        num_classes=3, multiple_of=8,
    )  # fmt: skip
    return GPT(config).eval()


def test_ar_records_one_start_then_a_one_token_step_per_remaining_position():
    model = tiny_gpt((4, 5))
    result = decode_ar(
        model, torch.tensor([1]), SamplerConfig(cfg_scale=2.0), torch.Generator().manual_seed(0)
    )
    calls = result.stats.calls
    assert calls == [("target.start", 0)] + [("target.step", 1)] * (4 * 5 - 1)
    assert calls == ar_schedule((4, 5))
    assert len(calls) == result.stats.sequential_steps == result.stats.target_forwards


def test_the_schedule_is_merged_by_add_and_kept_out_of_the_csv_row():
    first, second = DecodeStats(), DecodeStats()
    first.record_call("target", 3, "step")
    second.record_call("upsampler", 0, "upsample_rows", fed=64)
    second.record_call("drafter", 2)  # a caller naming no forward (methods/lockstep.py)
    row_before = first.as_dict()
    first.add(second)
    assert first.calls == [("target.step", 3), ("upsampler.upsample_rows", 64), ("drafter", 2)]
    assert "calls" not in first.as_dict() and set(first.as_dict()) == set(row_before)
    assert first.tokens_evaluated == 3 and first.sequential_steps == 3


class FakeSampler:
    def upsample_rows(self, ids_low, first_row):
        return ids_low

    def downsample(self, ids_high):
        return ids_high

    def step(self, state, features, embeddings, positions, parents=None, first=0):
        return features


def test_recorded_names_the_forward_and_counts_what_a_forward_fed_no_ids_was_given():
    stats = DecodeStats()
    Recorded(FakeSampler(), "upsampler", stats, UPSAMPLER).upsample_rows(torch.zeros(1, 3, 4), 0)
    Recorded(FakeSampler(), "downsampler", stats, DOWNSAMPLER).downsample(torch.zeros(1, 6, 8))
    features = torch.zeros(2, 5, 16)  # [B', n, dim]: 5 positions under guidance
    Recorded(FakeSampler(), "drafter", stats, DRAFT_HEAD).step("state", features, features, torch.arange(5))
    assert stats.calls == [
        ("upsampler.upsample_rows", 12),
        ("downsampler.downsample", 48),
        ("drafter.step", 5),
    ]
    assert stats.tokens_evaluated == 0


@pytest.mark.parametrize(("grid", "window"), [((8, 8), 4), ((6, 9), 2), ((5, 5), 7)])
def test_the_exact_zipar_schedule_has_zipar_s_call_count(grid, window):
    calls = zipar_schedule(grid, window)
    assert len(calls) == zipar_target_forwards(grid, window)
    assert calls[0] == ("target.start", 0)
    # every position but the last is fed once at its own slot, plus the stand-ins
    assert sum(n for _, n in calls) >= grid[0] * grid[1] - 1


def test_mulo_scaling_multiplies_drafter_steps_by_s_and_the_other_tokens_by_the_area():
    testbed = [
        ("target.start", 0), ("drafter.start", 0), ("drafter.step", 1), ("drafter.step", 2),
        ("upsampler.upsample_rows", 64), ("target.step", 255), ("target.step", 3),
    ]  # fmt: skip
    scaled = scale_schedule("mulo", testbed, 2, {"target": 1024, "drafter": 256, "upsampler": 256})
    assert scaled == [
        ("target.start", 0), ("drafter.start", 0), ("drafter.step", 2), ("drafter.step", 2),
        ("drafter.step", 4), ("drafter.step", 4), ("upsampler.upsample_rows", 256), ("target.step", 1020),
        ("target.step", 12),
    ]  # fmt: skip
    capped = scale_schedule("mulo", [("target.step", 255)], 4, {"target": 4000})
    assert capped == [("target.step", 4000)]


@pytest.mark.parametrize("method", ["lantern", "eagle2"])
def test_draft_and_verify_methods_repeat_every_cycle_call_by_the_area(method):
    testbed = [("target.start", 0), ("drafter.start", 0), ("drafter.step", 1), ("target.step", 5)]
    scaled = scale_schedule(method, testbed, 4)
    assert scaled[:2] == testbed[:2]
    assert scaled[2:] == [("drafter.step", 1)] * 16 + [("target.step", 5)] * 16
    with pytest.raises(ValueError, match="exact"):
        scale_schedule("ar", testbed, 2)


def test_buckets_cover_every_count_and_interpolation_is_linear_between_them():
    assert bucket_points([3, 5, 1020]) == [2, 4, 8, 16, 32, 64, 128, 256, 512, 1020]
    assert bucket_points([1, 4080], base=4) == [1, 4, 16, 64, 256, 1024, 4080]
    assert bucket_points([7]) == [4, 7]
    points = {1: 1.0, 4: 4.0, 16: 10.0}
    assert interpolate(points, 2) == pytest.approx(2.0)
    assert interpolate(points, 10) == pytest.approx(7.0)
    assert interpolate(points, 16) == 10.0 and interpolate(points, 100) == 10.0


def test_the_real_sets_have_the_converted_checkpoints_shapes():
    llamagen, tar = real_sets("real")
    assert (llamagen.target.dim, llamagen.target.n_layer, llamagen.target.n_head) == (1280, 36, 20)
    assert llamagen.target.grid_size == (32, 32) and llamagen.drafter.grid_size == (16, 16)
    assert llamagen.target.cond_len == 120 and llamagen.r == 2 and llamagen.cfg_scale == 7.5
    assert (tar.target.dim, tar.target.n_layer, tar.target.position) == (1280, 30, "absolute")
    assert tar.target.grid_size == (64, 64) and tar.drafter.grid_size == (16, 16) and tar.r == 4
    for real, tiny in zip(real_sets("real"), real_sets("tiny"), strict=True):
        assert tiny.target.grid_size == real.target.grid_size and tiny.r == real.r
        assert tiny.target.cond_len == real.target.cond_len and tiny.target.dim < real.target.dim


@pytest.mark.slow
def test_the_tiny_command_predicts_every_method_and_ar_from_its_step_time(tmp_path, capsys):
    schedules = tmp_path / "schedules.json"
    rows, timings = run(
        "tiny", "cpu", "float32", prompts=1, repeats=1, log=lambda message: None, schedules_file=schedules
    )
    labels = {label for label, _, _ in METHODS}
    for real in real_sets("tiny"):
        mine = {row["method"]: row for row in rows if row["set"] == real.name}
        assert set(mine) == labels - {f"MuLo-SD {r}x" for r in (2, 4) if r != real.r}
        time_of = {
            (t["model"], t["call"], t["tokens"]): t["seconds"] for t in timings if t["set"] == real.name
        }
        size = real.target.num_tokens
        ar = mine["AR"]
        assert ar["sequential_calls"] == size and ar["speedup_vs_ar"] == 1
        expected = time_of[("target", "start", 0)] + (size - 1) * time_of[("target", "step", 1)]
        assert ar["seconds_per_image"] == pytest.approx(expected, rel=1e-9)
        assert mine["ZipAR"]["sequential_calls"] == zipar_target_forwards(real.target.grid_size, 4)
        assert all(row["seconds_per_image"] > 0 for row in mine.values())
    out = tmp_path / "cost"
    args = ["--size", "tiny", "--repeats", "1", "--sets", "LlamaGen", "--schedules", str(schedules)]
    assert main([*args, "--out", str(out)]) == 0
    table = out.with_suffix(".md").read_text()
    assert all(column in table for column in PREDICTION_COLUMNS)
    assert (tmp_path / "cost.csv").exists() and (tmp_path / "cost_timings.csv").exists()
    assert "| LlamaGen-XL 512 (tiny) | MuLo-SD 2x |" in capsys.readouterr().out
