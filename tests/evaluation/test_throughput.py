"""Throughput (mulo_sd/evaluation/throughput.py) with a compiled run: it compiles in an untimed warm-up at
every batch size (compile_s), decodes the same steps as the eager run, and is measured against eager AR."""

import pytest
import torch

from mulo_sd.decoding.sampling import SamplerConfig
from mulo_sd.evaluation.runs import RunSpec
from mulo_sd.evaluation.throughput import measure_throughput
from mulo_sd.pipeline.testbed_models import load_models
from tests.real_eval_helpers import synthscenes_captions
from tests.training.test_decode_cli import save_tiny_testbed


def test_a_compiled_run_warms_up_at_each_batch_size_and_is_measured_against_eager_ar(tmp_path):
    models = load_models(save_tiny_testbed(tmp_path), names=["vq", "target"])
    runs = [RunSpec("ar", family="AR"), RunSpec("ar", family="AR (compiled)", compile=True)]
    captions, cpu = synthscenes_captions(2), torch.device("cpu")
    rows = measure_throughput(
        {run.label: models for run in runs}, runs, captions, [1, 2], 1, SamplerConfig(), cpu
    )
    row = {(row["label"], row["batch_size"]): row for row in rows}
    assert set(row) == {(label, size) for label in ("AR", "AR (compiled)") for size in (1, 2)}
    assert row["AR", 1]["compile_s"] == row["AR", 2]["compile_s"] == ""
    # a number at every batch size (0.0 once the process already holds these graphs, e.g. after other tests)
    assert all(isinstance(row["AR (compiled)", size]["compile_s"], float) for size in (1, 2))
    assert row["AR", 1]["vs_ar"] == row["AR", 2]["vs_ar"] == 1.0  # eager AR is the reference
    for size in (1, 2):
        assert row["AR (compiled)", size]["steps_per_batch"] == row["AR", size]["steps_per_batch"] == 64
    with pytest.raises(ValueError, match=r"over eager AR's images per second: add a run of method 'ar'"):
        measure_throughput({"AR (compiled)": models}, runs[1:], captions, [1], 1, SamplerConfig(), cpu)
