"""The markdown tables and the ablation plot of `mulo-eval` (docs/evaluation.md section 6): a number and its
bootstrap interval in one cell ("5.08 [4.91, 5.24]"), the table of every run against AR, one table per
ablation and the ablation plot.
"""

from __future__ import annotations

from pathlib import Path

from mulo_sd.evaluation.fd_minimum import without_unsupported_fd
from mulo_sd.testbed.synthscenes import BACKGROUNDS

# summary / matched column -> the prefix of its interval bounds (<prefix>_lo, <prefix>_hi)
BOUNDS = {
    "speedup_median": "speedup", "speedup": "speedup",
    "speedup_compiled_ar_median": "speedup_compiled_ar", "d_sceneeval": "d_sceneeval", "d_nll": "d_nll",
    "d_sceneeval_dev": "d_sceneeval_dev", "fd_ratio": "fd_ratio", "d_texture": "d_texture",
    "d_pattern": "d_pattern",
    **{f"d_{name}_{kind}": f"d_{name}_{kind}" for kind in BACKGROUNDS for name in ("pattern", "texture")},
}  # fmt: skip
PAIRED_COLUMNS = (
    "label", "images", "speedup_median", "speedup_compiled_ar_median", "step_ratio_median", "acceptance",
    "sceneeval", "d_sceneeval", "nll_mean", "d_nll", "fd", "fd_ratio", "fd_ar", "texture", "texture_ratio",
    "d_texture", "texture_gap", "pattern", "pattern_ratio", "d_pattern", "pattern_gap",
)  # fmt: skip
ABLATION_COLUMNS = (
    "label", "speedup_median", "sequential_steps_median", "acceptance", "sceneeval", "d_sceneeval", "fd",
    "fd_ratio", "fd_ar", "texture_ratio", "d_texture", "texture_gap", "pattern_ratio", "d_pattern",
    "pattern_gap",
)  # fmt: skip
# per background kind of the caption (summaries.background_kind_summary)
KIND_COLUMNS = (
    "label", "pattern", "d_pattern",
    *(f"{name}_{kind}" for kind in BACKGROUNDS
      for name in ("pattern", "d_pattern", "d_texture", "background")),
)  # fmt: skip
INTERVAL_NOTE = (
    "[low, high]: 95% bootstrap interval (percentile; prompts resampled, docs/evaluation.md section 5)"
)


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def markdown_table(rows: list[dict], columns: tuple[str, ...]) -> str:
    """A markdown table of `columns` (those present in the rows); an FD below its row's minimum reads
    "n/a (<N images)" (mulo_sd/evaluation/fd_minimum.py)."""
    columns = [c for c in columns if any(c in row for row in rows)]
    rows = [without_unsupported_fd(row) for row in rows]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(row.get(c)) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


def with_intervals(rows: list[dict]) -> list[dict]:
    """Copies of `rows` whose columns with interval bounds (BOUNDS) read 'value [low, high]'."""
    shown = []
    for row in rows:
        row = dict(row)
        for column, prefix in BOUNDS.items():
            low, high = row.get(f"{prefix}_lo"), row.get(f"{prefix}_hi")
            if row.get(column) is not None and low is not None:
                row[column] = f"{_cell(row[column])} [{_cell(low)}, {_cell(high)}]"
        shown.append(row)
    return shown


def paired_table(summary: list[dict]) -> str:
    """Every run against the reference: speedup, SceneEval, NLL, texture and pattern differences
    (intervals), FD, FD-to-AR, texture, pattern."""
    return markdown_table(with_intervals(summary), PAIRED_COLUMNS)


def background_kind_table(summary: list[dict]) -> str:
    """Every run's pattern, its and the texture's differences to the reference per background kind
    (intervals), beside the kind's background accuracy."""
    return markdown_table(with_intervals(summary), KIND_COLUMNS)


def ablation_groups(runs: list) -> dict[str, list[str]]:
    """Ablation name -> labels of its runs, in the order of the run entries."""
    groups: dict[str, list[str]] = {}
    for run in runs:
        for name in run.ablations:
            groups.setdefault(name, []).append(run.label)
    return groups


def ablation_tables(summary: list[dict], groups: dict[str, list[str]], reference: str) -> str:
    """One markdown table per ablation: the reference run, then the ablation's runs."""
    by_label = {entry["label"]: entry for entry in summary}
    sections = []
    for name, labels in groups.items():
        rows = [by_label[label] for label in (reference, *labels)]
        sections.append(f"### {name}\n\n{markdown_table(with_intervals(rows), ABLATION_COLUMNS)}")
    return "\n\n".join(sections)


def plot_ablations(summary: list[dict], groups: dict[str, list[str]], reference: str, path: Path) -> Path:
    """One panel per ablation: SceneEval difference to the reference against speedup, both with their
    intervals as error bars, each point labelled; the reference sits at (1, 0)."""
    from matplotlib.figure import Figure

    by_label = {entry["label"]: entry for entry in summary}
    figure = Figure(figsize=(4.2 * len(groups), 3.8))
    axes_row = figure.subplots(1, len(groups), squeeze=False)[0]
    for axes, (name, labels) in zip(axes_row, groups.items(), strict=True):
        for label in (reference, *labels):
            entry = by_label[label]
            x, y = entry["speedup_median"], entry.get("d_sceneeval")
            if y is None:
                continue
            xerr = _error(x, entry.get("speedup_lo"), entry.get("speedup_hi"))
            yerr = _error(y, entry.get("d_sceneeval_lo"), entry.get("d_sceneeval_hi"))
            axes.errorbar(x, y, xerr=xerr, yerr=yerr, marker="o", capsize=3)
            axes.annotate(label, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
        axes.axhline(0.0, color="grey", linewidth=0.6)
        axes.set_title(name, fontsize=9)
        axes.set_xlabel("speedup over AR (median, interval)")
        axes.set_ylabel("SceneEval - AR's (mean, interval)")
        axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    return path


def _error(value: float, low: float | None, high: float | None):
    return None if low is None else [[max(value - low, 0.0)], [max(high - value, 0.0)]]
