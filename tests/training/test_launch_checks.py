"""What `mulo-decode` and `mulo-eval` check and hold before any model loads: the seeds (training/seeds.py) and
mulo-eval's out_dir lock (training/eval_launch.py)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from mulo_sd.training import decode as decode_cli
from mulo_sd.training import evaluate as evaluate_cli
from mulo_sd.training import evaluate_prompts
from mulo_sd.training.run_folder import RANK_VARIABLES, RunFolderBusy

from mulo_sd.pipeline import mulo_pipeline
from tests.training.test_decode_cli import at, compose, save_tiny_testbed
from tests.training.test_run_folder import HOLDER, launcher_env

HUGE = 99999999999999999999999  # past 64 bits: "Overflow when unpacking long long" in manual_seed
RANGE = r"a seed must be an integer in \[0, 2\*\*63-1\]"


@pytest.fixture(scope="module")
def testbed(tmp_path_factory):
    return save_tiny_testbed(tmp_path_factory.mktemp("testbed"))


@pytest.fixture
def no_model_loads(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a model loaded")

    for module in (mulo_pipeline, evaluate_cli, evaluate_prompts):
        monkeypatch.setattr(module, "load_model_set", refuse)


@pytest.mark.parametrize("seed", [HUGE, 2**64 - 1, -1, 1.5])
def test_a_decode_seed_out_of_range_is_named_before_any_model_loads(testbed, tmp_path, no_model_loads, seed):
    overrides = ["method=ar", *at(testbed), f"seed={seed}", f"out={tmp_path / 'sample.png'}"]
    with pytest.raises(ValueError, match=rf"seed={re.escape(str(seed))}: {RANGE}"):
        decode_cli.run(compose("decode", tmp_path, overrides))


@pytest.mark.parametrize("knob", ["seeds", "fd_ar.seeds"])
def test_evaluation_seeds_out_of_range_are_named_before_any_model_loads(
    testbed, tmp_path, no_model_loads, knob
):
    cfg = compose("evaluate", tmp_path, ["eval=smoke", *at(testbed), f"{knob}=[2,{HUGE}]"])
    with pytest.raises(ValueError, match=rf"{re.escape(knob)}=\[2, {HUGE}\] holds {HUGE}: {RANGE}"):
        evaluate_cli.run(cfg)


def test_a_second_evaluation_into_a_busy_out_dir_is_refused_and_ranks_share_it(
    testbed, tmp_path, no_model_loads, monkeypatch
):
    for name in RANK_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    folder = tmp_path / "out"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(folder)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=launcher_env(),
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"  # another evaluation writes into out/
        cfg = compose("evaluate", tmp_path, ["eval=smoke", *at(testbed), f"out_dir={folder}"])
        refused = (
            rf"out_dir={re.escape(str(folder))}: another evaluation writes there.*in use by pid {holder.pid}"
        )
        with pytest.raises(RunFolderBusy, match=refused):
            evaluate_cli.run(cfg)
        monkeypatch.setenv("RANK", "1")  # a further rank of the holder's own run goes on to load its models
        with pytest.raises(AssertionError, match="a model loaded"):
            evaluate_cli.run(cfg)
    finally:
        holder.kill()
        holder.wait()
