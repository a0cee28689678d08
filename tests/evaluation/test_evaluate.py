import json
from collections import Counter

import pytest
import torch
from mulo_sd.training.config import CONFIG_DIR
from mulo_sd.training.evaluate import run
from omegaconf import OmegaConf
from PIL import Image

from mulo_sd.decoding.accept import ACCEPT_RULES
from mulo_sd.decoding.sampling import SamplerConfig
from mulo_sd.evaluation.harness import evaluate
from mulo_sd.evaluation.matched_quality import matched_quality_table
from mulo_sd.evaluation.runs import RunSpec, compiled_reference_run, expand_runs, reference_run
from mulo_sd.evaluation.summaries import add_ratios, summarize
from mulo_sd.pipeline.testbed_models import load_models
from mulo_sd.testbed.prompts import EVAL_SEED, evaluation_prompts
from mulo_sd.testbed.scene_checks import parse_caption, score
from mulo_sd.testbed.synthscenes import render_scene
from tests.helpers import read_csv
from tests.training.test_decode_cli import at, compose, save_tiny_testbed


@pytest.fixture(scope="module")
def testbed(tmp_path_factory):
    return save_tiny_testbed(tmp_path_factory.mktemp("testbed"))


def test_eval_cli_smoke_writes_every_file(testbed, tmp_path):
    cfg = compose("evaluate", tmp_path, ["eval=smoke", *at(testbed), "warmup=0"])
    result = run(cfg)
    out = tmp_path / "run"
    names = {p.name for p in out.iterdir()}
    assert {
        "runs.csv",
        "summary.csv",
        "summary.md",
        "speed_quality.png",
        "grid_seed0.png",
        "matched.md",
    } <= names
    runs = read_csv(out / "runs.csv")
    assert len(runs) == 5 * 2  # smoke: 5 runs x 2 prompts
    for column in ("family", "label", "method", "knobs", "prompt_index", "prompt", "seed", "wall_s",
                   "sequential_steps", "target_forwards", "drafter_forwards", "tokens_accepted", "speedup",
                   "step_ratio", "nfe_ratio", "nll", "sceneeval"):  # fmt: skip
        assert column in runs[0], column
    ar = [row for row in runs if row["method"] == "ar"]
    assert all(float(row["speedup"]) == 1.0 and float(row["target_forwards"]) == 64 for row in ar)
    assert {row["prompt"] for row in runs} == {render_scene(EVAL_SEED, i, 16)[1] for i in range(2)}
    summary = read_csv(out / "summary.csv")
    assert [row["family"] for row in summary] == [
        "AR",
        "ZipAR",
        "LANTERN",
        "MuLo-SD (2x)",
        "MuLo-SD (4x) pixel",
    ]
    for column in (
        "speedup_median",
        "speedup_of_medians",
        "step_ratio_median",
        "nll_mean",
        "sceneeval",
        "sceneeval_object",
        "sceneeval_colour",
        "fd",
    ):
        assert all(row[column] != "" for row in summary), column
    for row in runs:  # the per-kind scores, weighted by their numbers of checks, make up the prompt score
        stated = Counter(check.kind for check in parse_caption(row["prompt"]))
        passed = sum(float(row[f"sceneeval_{kind}"]) * n for kind, n in stated.items())
        assert float(row["sceneeval"]) == pytest.approx(passed / sum(stated.values()))
    assert float(summary[1]["step_ratio_median"]) == pytest.approx(64 / (8 + 7 * 4))  # ZipAR W=4
    assert json.loads(summary[3]["knobs"]) == {"accept_rule": "absolute", "r": 2, "tau": 0.1, "k": 4}
    grid = Image.open(out / "grid_seed0.png")
    assert grid.size[1] > grid.size[0]  # 6 rows (real + 5 runs) of 2 prompts
    assert len(result.matched) == 5 and result.matched[0]["method"] == "AR"
    assert "| method | setting | speedup |" in (out / "matched.md").read_text()
    references = read_csv(out / "references.csv")
    assert [row["label"] for row in references] == ["real images", "tokenizer round trip", "AR (other seeds)"]
    models = load_models(testbed, names=["vq", "sceneeval"])
    prompts = evaluation_prompts(2, image_size=16)
    real = torch.stack([p.image for p in prompts])
    expected = score(models.sceneeval, real, [p.caption for p in prompts]).mean()
    assert float(references[0]["sceneeval"]) == pytest.approx(float(expected))
    assert float(references[0]["fd"]) == pytest.approx(0.0, abs=1e-3)  # the real images against themselves
    assert "## References" in (out / "summary.md").read_text()


def test_evaluate_speed_only(testbed, tmp_path, capsys):
    models = load_models(testbed, names=["vq", "target"])
    runs = [RunSpec("ar"), RunSpec("zipar", {"window": 2})]
    prompts = evaluation_prompts(2, image_size=16)
    result = evaluate(
        models, runs, prompts, [3, 4], SamplerConfig(), "cpu", tmp_path, quality=False, grid_prompts=1
    )
    zipar = [row for row in result.rows if row["method"] == "zipar"]
    order = [(row["label"], row["prompt_index"], row["seed"]) for row in result.rows]
    assert order == [
        (label, i, seed) for label in ("ar", "zipar window=2") for i in (0, 1) for seed in (3, 4)
    ]
    assert all(row["step_ratio"] == row["nfe_ratio"] == 64 / 22 for row in zipar)
    assert "nll" not in result.rows[0] and "sceneeval" not in result.summary[0]
    assert (tmp_path / "speed_quality.png").is_file() and (tmp_path / "grid_seed3.png").is_file()
    bar = capsys.readouterr().err.split("\r")[-1]  # the bar's final state: 2 runs x 2 prompts x 2 seeds
    assert "8/8" in bar and "prompt 2/2, seed 4:" in bar


def test_evaluate_refuses_a_run_set_without_ar(testbed, tmp_path):
    models = load_models(testbed, names=["vq", "target"])
    with pytest.raises(ValueError, match=r"needs exactly one 'ar' run \(the speed reference\), got \[\]"):
        evaluate(models, [RunSpec("zipar", {"window": 2})], evaluation_prompts(1, image_size=16), [0],
                 SamplerConfig(), "cpu", tmp_path)  # fmt: skip


def hand_rows(label, walls, steps, method="x"):
    return [
        {"family": label, "label": label, "method": method, "knobs": "{}", "prompt_index": i, "seed": 0,
         "wall_s": wall, "sequential_steps": step, "target_forwards": step, "drafter_forwards": 0,
         "tokens_drafted": 10, "tokens_accepted": 5}
        for i, (wall, step) in enumerate(zip(walls, steps, strict=True))
    ]  # fmt: skip


def test_speedup_median_of_ratios_and_ratio_of_medians():
    rows = hand_rows("AR", [1.0, 2.0, 4.0], [64, 64, 64], "ar") + hand_rows(
        "X", [0.5, 0.5, 4.0], [16, 32, 64]
    )
    add_ratios(rows, "AR")
    assert [row["speedup"] for row in rows[3:]] == [2.0, 4.0, 1.0]
    ar, x = summarize(rows, "AR")
    assert ar["speedup_median"] == ar["speedup_of_medians"] == 1.0
    assert x["speedup_median"] == 2.0  # median of the per-prompt ratios 2, 4, 1
    assert x["speedup_of_medians"] == 4.0  # AR median 2.0 s over X median 0.5 s
    assert x["step_ratio_median"] == 2.0 and x["sequential_steps_median"] == 32  # ratios 4, 2, 1
    assert x["acceptance"] == 0.5 and x["images"] == 3
    with pytest.raises(ValueError, match=r"no 'AR' row for prompt 2, seed 0"):
        add_ratios(rows[:2] + rows[3:], "AR")


def test_speedup_against_a_compiled_ar_pairs_each_decode_with_the_compiled_ar_one():
    rows = hand_rows("AR", [2.0, 4.0, 6.0], [64] * 3, "ar") + hand_rows(
        "AR (compiled)", [1.0, 2.0, 4.0], [64] * 3, "ar"
    )
    rows += hand_rows("X", [0.5, 1.0, 1.0], [16, 32, 64])
    add_ratios(rows, "AR", "AR (compiled)")
    assert [row["speedup_compiled_ar"] for row in rows[6:]] == [2.0, 2.0, 4.0]
    ar, compiled, x = summarize(rows, "AR")
    assert ar["speedup_compiled_ar_median"] == 0.5 and compiled["speedup_median"] == 2.0
    assert x["speedup_median"] == 4.0 and x["speedup_compiled_ar_median"] == 2.0
    eager_only = hand_rows("AR", [1.0], [64], "ar")
    add_ratios(eager_only, "AR")
    assert "speedup_compiled_ar" not in eager_only[0]
    assert "speedup_compiled_ar_median" not in summarize(eager_only, "AR")[0]
    runs = expand_runs([{"method": "ar"}, {"method": "ar", "label": "AR (compiled)", "compile": True}])
    assert reference_run(runs).compile is False and compiled_reference_run(runs).label == "AR (compiled)"
    assert compiled_reference_run(runs[:1]) is None
    with pytest.raises(ValueError, match=r"at most one compiled 'ar' run .* got \['AR \(compiled\)', 'c2'\]"):
        compiled_reference_run([*runs, RunSpec("ar", label="c2", compile=True)])


def test_matched_quality_table_picks_the_fastest_run_within_tolerance_on_either_side():
    def entry(family, setting, speedup, score):
        label = f"{family} {setting}".strip()
        method = {"AR": "ar", "ZipAR": "zipar", "LANTERN": "lantern"}.get(family, "mulo")
        return {"family": family, "label": label, "method": method, "speedup_median": speedup,
                "speedup_of_medians": speedup, "step_ratio_median": speedup, "sceneeval": score, "fd": 1.0,
                "nll_mean": 2.0}  # fmt: skip

    summary = [
        entry("AR", "", 1.0, 0.80),
        entry("ZipAR", "window=2", 3.0, 0.70),
        entry("ZipAR", "window=4", 2.0, 0.79),
        entry("ZipAR", "window=8", 1.5, 0.81),
        entry("LANTERN", "delta=0.4", 1.2, 0.60),
        entry("MuLo-SD (2x)", "tau=0.3", 1.8, 0.81),
        entry("MuLo-SD (2x)", "tau=0.1", 2.5, 0.785),
        entry("MuLo-SD (2x)", "tau=0.03", 4.0, 0.85),  # fastest, but 0.05 above AR: not a match
    ]
    table = matched_quality_table(summary, "ar", rule="tolerance", tolerance=0.02)
    assert [(row["method"], row["setting"], row["speedup"]) for row in table] == [
        ("AR", "-", 1.0),
        ("ZipAR", "window=4", 2.0),
        ("LANTERN", None, None),  # nothing within 0.02 of AR's 0.80
        ("MuLo-SD (2x)", "tau=0.1", 2.5),
    ]
    wide = matched_quality_table(summary, "ar", rule="tolerance", tolerance=0.15)
    assert [row["setting"] for row in wide[1:]] == ["window=2", None, "tau=0.03"]
    with pytest.raises(ValueError, match=r"matched quality needs SceneEval scores"):
        matched_quality_table(
            [{k: v for k, v in row.items() if k != "sceneeval"} for row in summary],
            rule="tolerance",
            tolerance=0,
        )


def test_expand_runs_sweeps_and_errors():
    runs = expand_runs([
        {"method": "ar", "family": "AR"},
        {"method": "zipar", "family": "ZipAR", "sweep": {"window": [2, 4]}},
        {"method": "mulo", "family": "MuLo-SD (2x)", "knobs": {"r": 2, "k": 4}, "sweep": {"tau": [0.1]}},
    ])  # fmt: skip
    assert [run.label for run in runs] == ["AR", "ZipAR window=2", "ZipAR window=4", "MuLo-SD (2x) tau=0.1"]
    assert runs[3].knobs == {"r": 2, "k": 4, "tau": 0.1} and runs[3].family == "MuLo-SD (2x)"
    assert RunSpec("zipar", {"window": 4}).label == "zipar window=4"
    with pytest.raises(ValueError, match=r"sweeps one knob"):
        expand_runs([{"method": "mulo", "knobs": {"r": 2, "k": 0}, "sweep": {"tau": [0.1], "l": [1]}}])
    with pytest.raises(ValueError, match=r"unknown knob\(s\) \['delta'\] for method 'zipar'"):
        expand_runs([{"method": "zipar", "knobs": {"window": 2, "delta": 0.1}}])
    with pytest.raises(
        ValueError, match=r"a run entry has keys method, family, label, knobs, sweep, folders"
    ):
        expand_runs([{"family": "AR"}])


def test_evaluation_prompts_are_fixed_and_held_out():
    first, again = evaluation_prompts(3, image_size=16), evaluation_prompts(3, image_size=16)
    assert [p.caption for p in first] == [p.caption for p in again]
    assert all(torch.equal(a.image, b.image) for a, b in zip(first, again, strict=True))
    image, caption, attributes = render_scene(EVAL_SEED, 2, 16)
    assert first[2].caption == caption and first[2].attributes == attributes
    assert first[2].image.shape == (3, 16, 16) and -1 <= first[2].image.min() <= first[2].image.max() <= 1
    assert EVAL_SEED not in (1, 2)  # the streams conf/data/synthscenes.yaml trains and validates on


EVAL_PRESETS = sorted(path.stem for path in (CONFIG_DIR / "eval").glob("*.yaml"))


@pytest.mark.parametrize("preset", EVAL_PRESETS)
def test_every_mulo_run_of_a_preset_names_its_accept_rule(preset):
    """A preset's row means one rule whatever mulo_sd.pipeline.decode_entry.RECOMMENDED says: when the
    recommended rule moved
    to typical, rows labelled with the paper's rule silently decoded with the typical one."""
    runs = OmegaConf.load(CONFIG_DIR / "eval" / f"{preset}.yaml").get("runs") or []
    rules = {run.get("label", run["family"]): run.get("knobs", {}).get("accept_rule") for run in runs
             if run["method"] == "mulo"}  # fmt: skip
    assert preset not in ("paper_table", "ablations") or rules
    assert {label: rule for label, rule in rules.items() if rule not in ACCEPT_RULES} == {}


PRESETS = ["smoke", "speed_zipar", "paper_table", "compiled", "headline_256", "defaults_dev_256", "goals_256"]


@pytest.mark.parametrize("preset", PRESETS)
def test_every_eval_preset_expands_to_valid_runs(testbed, tmp_path, preset):
    cfg = compose("evaluate", tmp_path, [f"eval={preset}", *at(testbed)])
    runs = expand_runs(OmegaConf.to_container(cfg.runs, resolve=True))  # raises on an unknown knob
    assert reference_run(runs).method == "ar"  # and on a missing AR run or a repeated label
    if preset == "compiled":  # every run eager and compiled, the compiled AR a second speed reference
        assert compiled_reference_run(runs).label == "AR (compiled)"
        assert sorted(run.compile for run in runs) == [False] * 5 + [True] * 7  # and two compiled ceilings
        assert [run.knobs["tau"] for run in runs if "every draft accepted" in run.label] == [0.0, 0.0]
    if preset == "paper_table":
        families = {run.family for run in runs}
        assert {"AR", "ZipAR", "LANTERN", "MuLo-SD (2x)", "MuLo-SD (4x)"} <= families
