"""The paper's metric table for a prompt-file evaluation (docs/real_evaluation.md section 5): per method and
setting (tau, window, ...) the batch-1 speedup, where its images lie in GenEval's and DPG-Bench's layouts (for
their official scorers), FID, HPSv2, CLIP score and, once GenEval's scorer has run on a run's folder, its
GenEval score.

GenEval's scorer (djghosh13/geneval, evaluation/evaluate_images.py) writes one JSON line per image with
`filename`, `tag` and `correct`; its overall score (evaluation/summary_scores.py) is the mean over the tags
of each tag's fraction of correct images. Written to `<out_dir>/geneval/<run folder>.jsonl`, it is read
back by the next `mulo-eval` on the same out_dir (every image is found done, so only the scoring runs) and
becomes the `geneval` column, per split (an image's prompt is its `<index>` folder).
"""

from __future__ import annotations

import json
from pathlib import Path

from mulo_sd.evaluation.tables import markdown_table

PAPER_COLUMNS = (
    "method", "setting", "speedup", "geneval", "geneval_layout", "dpg_layout", "fid", "hpsv2", "clip_score",
)  # fmt: skip
GENEVAL_FOLDER = "geneval"  # <out_dir>/geneval/<run folder>.jsonl: GenEval's scorer's output for the run


def geneval_score(results: Path, prompt_indices: set[int] | None = None) -> float | None:
    """GenEval's overall score (mean over tags of the fraction correct) of the results file's images whose
    prompt is in `prompt_indices` (None: all); None when none is."""
    by_tag: dict[str, list[bool]] = {}
    for number, line in enumerate(Path(results).read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
            index = int(Path(entry["filename"]).parent.parent.name)  # <index>/samples/<seed>.png
            tag, correct = entry["tag"], entry["correct"]
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as error:
            raise ValueError(
                f"{results}, line {number}: not a GenEval result with filename <index>/samples/<seed>.png, "
                f"tag and correct ({error})"
            ) from None
        if prompt_indices is None or index in prompt_indices:
            by_tag.setdefault(tag, []).append(bool(correct))
    if not by_tag:
        return None
    return sum(sum(values) / len(values) for values in by_tag.values()) / len(by_tag)


def paper_rows(summary: list[dict], split: str, layouts: dict[str, dict[str, Path]]) -> list[dict]:
    """One row per run of `split`: PAPER_COLUMNS; `layouts`: layout name ("geneval", "dpg") -> run label ->
    the run's folder in that layout (a run without one shows "-")."""
    rows = []
    for entry in (e for e in summary if e["split"] == split):
        label, family = entry["label"], entry["family"]
        setting = label[len(family) :].strip() if label.startswith(family) else label
        rows.append({
            "method": family, "setting": setting or "-", "speedup": entry.get("speedup_median"),
            "geneval": entry.get("geneval"),
            "geneval_layout": str(layouts.get("geneval", {}).get(label, "-")),
            "dpg_layout": str(layouts.get("dpg", {}).get(label, "-")),
            "fid": entry.get("fid"), "hpsv2": entry.get("hpsv2"), "clip_score": entry.get("clip_score"),
        })  # fmt: skip
    return rows


def write_paper_table(path: Path, rows: list[dict], note: str) -> str:
    """paper_table.md: the note, then the table; returns the text (printed by mulo-eval)."""
    text = f"{note}\n\n{markdown_table(rows, PAPER_COLUMNS)}\n"
    path.write_text(text)
    return text
