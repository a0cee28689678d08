import json

import pytest

from mulo_sd.evaluation.matched_quality import matched_runs
from mulo_sd.evaluation.prompt_sets import PromptRecord
from mulo_sd.evaluation.real_evaluate import add_geneval_scores, matched_split_table
from mulo_sd.evaluation.real_table import geneval_score, paper_rows
from mulo_sd.evaluation.runs import RunSpec


def write_results(path, outcomes):
    """GenEval's evaluate_images.py output: one line per image (prompt index, tag, correct)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "".join(
            json.dumps({"filename": f"/x/images/AR/{index:05d}/samples/{seed:04d}.png", "tag": tag,
                        "correct": correct, "reason": "", "metadata": "{}"}) + "\n"
            for seed, (index, tag, correct) in enumerate(outcomes)
        )
    )  # fmt: skip
    return path


def test_geneval_score_is_the_mean_over_tags_of_the_fraction_correct(tmp_path):
    results = write_results(
        tmp_path / "r.jsonl",
        [(0, "counting", True), (0, "counting", False), (1, "counting", False), (2, "colors", True)],
    )
    # summary_scores.py: counting 1/3, colors 1/1 -> (1/3 + 1) / 2
    assert geneval_score(results) == pytest.approx((1 / 3 + 1) / 2)
    assert geneval_score(results, {0}) == pytest.approx(0.5)
    assert geneval_score(results, {7}) is None
    (tmp_path / "bad.jsonl").write_text('{"filename": "a.png", "tag": "x", "correct": true}\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl, line 1: not a GenEval result"):
        geneval_score(tmp_path / "bad.jsonl")


def entry(split, family, setting, method, speedup, geneval):
    label = f"{family} {setting}".strip()
    return {"split": split, "family": family, "label": label, "method": method, "speedup_median": speedup,
            "speedup_of_medians": speedup, "step_ratio_median": speedup, "geneval": geneval}  # fmt: skip


def test_tau_where_geneval_matches_lanterns_beside_the_matched_ar_rule():
    summary = [
        entry("all", "AR", "", "ar", 1.0, 0.60),
        entry("all", "LANTERN", "", "lantern", 1.8, 0.55),
        entry("all", "MuLo-SD", "tau=0.01", "mulo", 2.0, 0.59),
        entry("all", "MuLo-SD", "tau=0.05", "mulo", 3.0, 0.56),
        entry("all", "MuLo-SD", "tau=0.2", "mulo", 4.0, 0.40),
    ]
    by_ar = matched_split_table(summary, "geneval", 0.02, reference="ar")
    by_lantern = matched_split_table(summary, "geneval", 0.02, reference="lantern")
    assert [(row["method"], row["setting"]) for row in by_ar] == [
        ("AR", "-"), ("LANTERN", None), ("MuLo-SD", "tau=0.01"),
    ]  # fmt: skip
    assert [(row["method"], row["setting"], row["speedup"]) for row in by_lantern] == [
        ("LANTERN", "-", 1.8), ("AR", None, None), ("MuLo-SD", "tau=0.05", 3.0),
    ]  # fmt: skip
    # SceneEval's interval rule reads paired differences to AR: it cannot match another run
    with pytest.raises(
        ValueError, match=r"rule 'interval' reads the paired differences to ar, not to 'lantern'"
    ):
        matched_runs(
            [e | {"d_geneval_lo": -1, "d_geneval_hi": 1} for e in summary],
            "lantern",
            None,
            "geneval",
            "interval",
        )


def test_geneval_results_of_a_run_fill_its_column_per_split_and_the_paper_rows(tmp_path):
    runs = [RunSpec("ar", family="AR"), RunSpec("zipar", family="ZipAR", knobs={"window": 2})]
    prompts = [PromptRecord(i, f"p{i}") for i in range(3)]
    splits = {"dev": prompts[:1], "test": prompts[1:]}
    write_results(
        tmp_path / "geneval" / "AR.jsonl", [(0, "colors", False), (1, "colors", True), (2, "colors", True)]
    )
    summary = [{"split": split, "family": run.family, "label": run.label} for split in splits for run in runs]
    add_geneval_scores(summary, runs, splits, tmp_path)
    assert [e.get("geneval") for e in summary] == [0.0, None, 1.0, None]  # no results for ZipAR yet
    rows = paper_rows(summary, "test", {"geneval": {"AR": tmp_path / "images" / "AR"}})
    assert rows[0] | {"geneval_layout": None} == {
        "method": "AR", "setting": "-", "speedup": None, "geneval": 1.0, "geneval_layout": None,
        "dpg_layout": "-", "fid": None, "hpsv2": None, "clip_score": None,
    }  # fmt: skip
    assert rows[0]["geneval_layout"] == str(tmp_path / "images" / "AR") and rows[1]["geneval_layout"] == "-"
