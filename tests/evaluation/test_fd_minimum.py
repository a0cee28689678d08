"""FD and FD ratios are shown only where the sample count supports them (docs/statistics.md section 5):
a row of fewer than `fd_min_images` images reads "n/a (<N images)" in every table and in what mulo-eval
prints; the CSVs keep the numbers and say which rows are below the minimum."""

from __future__ import annotations

import yaml
from mulo_sd.training.config import CONFIG_DIR
from mulo_sd.training.evaluate import run

from mulo_sd.evaluation.fd_minimum import MIN_FD_IMAGES, mark_fd_minimum
from mulo_sd.evaluation.matched_quality import MATCHED_COLUMNS, matched_quality_table
from mulo_sd.evaluation.tables import markdown_table, paired_table, with_intervals
from tests.evaluation.test_evaluate import testbed  # noqa: F401 (the fixture)
from tests.helpers import read_csv
from tests.training.test_decode_cli import at, compose

NOTE = f"n/a (<{MIN_FD_IMAGES} images)"


def entry(label: str, images: int) -> dict:
    return {"label": label, "images": images, "fd": 22.05, "fd_ratio": 0.3515, "fd_ratio_lo": 0.2598,
            "fd_ratio_hi": 0.5802, "fd_ar": 43.01, "sceneeval": 0.5}  # fmt: skip


def test_tables_show_a_note_instead_of_fds_below_the_minimum():
    rows = [entry("few", MIN_FD_IMAGES - 1), entry("enough", MIN_FD_IMAGES)]
    mark_fd_minimum(rows)
    assert [row["fd_below_minimum"] for row in rows] == [True, False]
    few, enough = paired_table(rows).splitlines()[2:]
    assert few.count(NOTE) == 3 and "22.05" not in few and "0.3515" not in few and "0.5802" not in few
    assert "| 22.05 | 0.3515 [0.2598, 0.5802] | 43.01 |" in enough and NOTE not in enough
    assert rows[0]["fd"] == 22.05  # the numbers stay for the CSVs
    mark_fd_minimum(rows, minimum=0)
    assert NOTE not in paired_table(rows)


def test_the_matched_table_carries_the_minimum():
    speed = {"speedup_median": 1.0, "speedup_of_medians": 1.0, "step_ratio_median": 1.0}
    matching = {"d_sceneeval_lo": -0.1, "d_sceneeval_hi": 0.1}
    rows = [{**entry(label, 8), "family": label, "method": label.lower(), **speed, **matching}
            for label in ("AR", "ZipAR")]  # fmt: skip
    mark_fd_minimum(rows)
    text = markdown_table(with_intervals(matched_quality_table(rows, "ar")), MATCHED_COLUMNS)
    assert text.count(NOTE) == 2 * 3 and "22.05" not in text


def test_the_config_default_is_the_runtime_minimum():
    assert yaml.safe_load((CONFIG_DIR / "evaluate.yaml").read_text())["fd_min_images"] == MIN_FD_IMAGES


def test_smoke_prints_no_fd_ratio_on_two_images(testbed, tmp_path, capsys):  # noqa: F811
    result = run(compose("evaluate", tmp_path, ["eval=smoke", *at(testbed), "warmup=0", "progress=false"]))
    printed = capsys.readouterr().out
    text = (tmp_path / "run" / "summary.md").read_text()
    for shown in (printed, text, (tmp_path / "run" / "matched.md").read_text()):
        assert NOTE in shown
    tables = 0
    for table in text.split("\n\n"):  # 2 prompts x 1 seed: no FD number in any table
        if not table.startswith("|"):
            continue
        header, _, *rows = [line.split(" | ") for line in table.splitlines()]
        fd_cells = [n for n, name in enumerate(header) if name.strip("| ") in ("fd", "fd_ratio", "fd_ar")]
        tables += bool(fd_cells)
        assert all(row[n].strip("| ") == NOTE for row in rows for n in fd_cells)
    assert tables == 3  # the summary, against AR and the references
    summary = read_csv(tmp_path / "run" / "summary.csv")
    assert {row["fd_below_minimum"] for row in summary} == {"True"}
    assert float(summary[1]["fd"]) == result.evaluation.summary[1]["fd"] > 0  # the CSV keeps the number
    assert {row["fd_below_minimum"] for row in read_csv(tmp_path / "run" / "references.csv")} == {"True"}
