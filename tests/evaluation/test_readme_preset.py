"""conf/eval/readme.yaml, the README's results table: every method at its default knobs. The preset writes its
knobs out (each row keeps its meaning, tests/evaluation/test_evaluate.py); here they must still be the
defaults (mulo_sd.pipeline.decode_entry.RECOMMENDED under the testbed set's own knobs,
conf/models/testbed.yaml: what MuLoPipeline.from_pretrained() runs), so moving a default fails until the
table is re-measured."""

from __future__ import annotations

from mulo_sd.training.config import CONFIG_DIR
from omegaconf import OmegaConf

from mulo_sd.pipeline import MuLoPipeline
from mulo_sd.pipeline.decode_entry import resolve_knobs


def test_the_readme_preset_runs_every_method_at_its_defaults():
    runs = OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / "eval" / "readme.yaml").runs)
    testbed = MuLoPipeline.from_pretrained()
    assert sorted(run["method"] for run in runs) == ["ar", "eagle2", "lantern", "mulo", "mulo", "zipar"]
    for run in runs:
        knobs = run.get("knobs", {})
        defaults = {"r": knobs["r"]} if run["method"] == "mulo" else {}  # MuLo-SD's scale is the row's
        expected = resolve_knobs(run["method"], testbed.method_knobs(run["method"], defaults))
        assert resolve_knobs(run["method"], knobs) == expected, run["family"]
    assert sorted(run["knobs"]["r"] for run in runs if run["method"] == "mulo") == [2, 4]
