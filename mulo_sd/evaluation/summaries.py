"""Per-run statistics of the speed/quality harness (docs/statistics.md sections 3-4, docs/evaluation.md
section 5): every decode row's ratios and paired differences to the reference decode of the same prompt and
seed, one summary entry per run and split (medians, means, bootstrap intervals), the FD ratios to the
reference.
"""

from __future__ import annotations

import statistics

import numpy as np

from mulo_sd.evaluation.fd_ratio import fd_ratio_intervals
from mulo_sd.evaluation.paired import BOOTSTRAP, Bootstrap, interval, per_seed_samples
from mulo_sd.evaluation.texture import texture_summary
from mulo_sd.testbed.prompts import Prompt
from mulo_sd.testbed.scene_checks import BACKGROUND, CHECK_KINDS
from mulo_sd.testbed.synthscenes import BACKGROUNDS

# per-decode scores differenced with the reference decode (d_<score>)
PAIRED = ("sceneeval", "nll", "texture", "pattern", f"sceneeval_{BACKGROUND}")


def reported_splits(splits: list[str]) -> list[str]:
    """The splits whose numbers are reported: all but dev (which only picks settings), or dev when alone."""
    return [split for split in splits if split != "dev"] or splits


def add_ratios(rows: list[dict], reference: str, compiled_reference: str | None = None) -> None:
    """Add speedup, step_ratio and nfe_ratio to every row: the reference run's (label `reference`) wall time,
    sequential steps and target forwards for the same prompt and seed over the row's own; and for each score
    of PAIRED the rows carry, d_<score> = the row's score - the reference decode's. With a compiled AR run
    (label `compiled_reference`), also speedup_compiled_ar: its wall time for the same decode over the
    row's."""
    base = _by_decode(rows, reference)
    compiled = _by_decode(rows, compiled_reference) if compiled_reference else {}
    for row in rows:
        key = (row.get("split"), row["prompt_index"], row["seed"])
        if key not in base:
            where = f" ({key[0]} split)" if key[0] else ""
            raise ValueError(
                f"no '{reference}' row for prompt {key[1]}{where}, seed {key[2]}: cannot form its ratios"
            )
        ref = base[key]
        row["speedup"] = ref["wall_s"] / row["wall_s"]
        if compiled:
            row["speedup_compiled_ar"] = compiled[key]["wall_s"] / row["wall_s"]
        row["step_ratio"] = ref["sequential_steps"] / row["sequential_steps"]
        row["nfe_ratio"] = ref["target_forwards"] / row["target_forwards"]
        for score in PAIRED:
            if score in row and score in ref:
                row[f"d_{score}"] = row[score] - ref[score]


def _by_decode(rows: list[dict], label: str) -> dict:
    return {
        (row.get("split"), row["prompt_index"], row["seed"]): row for row in rows if row["label"] == label
    }


def add_fd_ratios(
    summary: list[dict], features: dict, real: dict, prompts: list[Prompt], reference: str,
    reported: list[str], bootstrap: Bootstrap,
) -> None:  # fmt: skip
    """Every summary entry's `fd_ratio` (its FD over the reference run's, same split) and, on the reported
    splits, its interval `fd_ratio_lo` .. `fd_ratio_hi` (mulo_sd/evaluation/fd_ratio.py). features: (label,
    split) -> {(prompt index, seed): features}; real: split -> features of the split's real images in prompt
    order."""
    base = {entry["split"]: entry["fd"] for entry in summary if entry["label"] == reference}
    for entry in summary:
        entry["fd_ratio"] = entry["fd"] / base[entry["split"]] if base[entry["split"]] > 0 else None
    for split in reported:
        indices = [p.index for p in prompts if p.split == split]
        entries = [entry for entry in summary if entry["split"] == split]
        runs = {entry["label"]: features[entry["label"], split] for entry in entries}
        bounds = fd_ratio_intervals(dict(zip(indices, real[split], strict=True)), runs, reference, bootstrap)
        for entry in entries:
            entry["fd_ratio_lo"], entry["fd_ratio_hi"] = bounds[entry["label"]]


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def summarize(rows: list[dict], reference: str, bootstrap: Bootstrap = BOOTSTRAP) -> list[dict]:
    """One entry per run label (in order of first appearance) from rows of one split carrying `add_ratios`'
    columns; intervals (`_lo`, `_hi`) of the median speedup and of the mean paired differences from
    `bootstrap` over the prompts (mulo_sd/evaluation/paired.py)."""
    labels = list(dict.fromkeys(row["label"] for row in rows))
    reference_wall = statistics.median(row["wall_s"] for row in rows if row["label"] == reference)
    summary = []
    for label in labels:
        runs = [row for row in rows if row["label"] == label]
        entry = _speed_summary(runs, reference_wall, bootstrap)
        if "nll" in runs[0]:
            entry["nll_mean"] = _mean([row["nll"] for row in runs])
        if "sceneeval" in runs[0]:
            entry |= sceneeval_summary(runs)
        if "texture" in runs[0]:
            entry |= texture_summary(runs)
        for score in PAIRED:
            if f"d_{score}" in runs[0]:
                entry |= _paired_summary(runs, score, bootstrap)
        if runs[0].get("background") is not None and "d_pattern" in runs[0]:
            entry |= background_kind_summary(runs, bootstrap)
        summary.append(entry)
    return summary


def _speed_summary(runs: list[dict], reference_wall: float, bootstrap: Bootstrap) -> dict:
    """A run's identity and speed columns from its rows; reference_wall: the reference's median wall time."""
    first = runs[0]
    wall_median = statistics.median(row["wall_s"] for row in runs)
    drafted = sum(row["tokens_drafted"] for row in runs)
    low, high = interval(per_seed_samples(runs, "speedup"), np.median, bootstrap)
    entry = {
        "split": first.get("split", "all"), "family": first["family"], "label": first["label"],
        "method": first["method"], "knobs": first["knobs"], "images": len(runs),
        "wall_s_median": wall_median,
        "speedup_median": statistics.median(row["speedup"] for row in runs), "speedup_lo": low,
        "speedup_hi": high, "speedup_of_medians": reference_wall / wall_median,
        "sequential_steps_median": statistics.median(row["sequential_steps"] for row in runs),
        "step_ratio_median": statistics.median(row["step_ratio"] for row in runs),
        "target_forwards_mean": _mean([row["target_forwards"] for row in runs]),
        "drafter_forwards_mean": _mean([row["drafter_forwards"] for row in runs]),
        "nfe_ratio_median": statistics.median(row["nfe_ratio"] for row in runs),
        "acceptance": sum(row["tokens_accepted"] for row in runs) / drafted if drafted else None,
    }  # fmt: skip
    if "speedup_compiled_ar" in first:
        low, high = interval(per_seed_samples(runs, "speedup_compiled_ar"), np.median, bootstrap)
        entry["speedup_compiled_ar_median"] = statistics.median(row["speedup_compiled_ar"] for row in runs)
        entry["speedup_compiled_ar_lo"], entry["speedup_compiled_ar_hi"] = low, high
    return entry


def _paired_summary(runs: list[dict], score: str, bootstrap: Bootstrap) -> dict:
    """The mean of a run's paired differences d_<score> and its bootstrap interval over the prompts."""
    samples = per_seed_samples(runs, f"d_{score}")
    low, high = interval(samples, np.mean, bootstrap)
    return {f"d_{score}": float(np.concatenate(samples).mean()), f"d_{score}_lo": low, f"d_{score}_hi": high}


def background_kind_summary(runs: list[dict], bootstrap: Bootstrap) -> dict:
    """Per background kind the caption names (BACKGROUNDS): the run's mean pattern and texture, their paired
    differences to the reference d_pattern_<kind> and d_texture_<kind> with intervals over that kind's
    prompts, and the background accuracy. The mean over all images lets blotches drawn over gradients (more
    texture and pattern than AR) offset stripes lost (less), which the eye does not; per kind both show
    (docs/statistics.md section 6)."""
    entry = {}
    for kind in BACKGROUNDS:
        rows = [row for row in runs if row["background"] == kind]
        if not rows:
            continue
        for statistic in ("pattern", "texture"):
            entry[f"{statistic}_{kind}"] = _mean([row[statistic] for row in rows])
            paired = _paired_summary(rows, statistic, bootstrap)
            for end in ("", "_lo", "_hi"):
                entry[f"d_{statistic}_{kind}{end}"] = paired[f"d_{statistic}{end}"]
        if "sceneeval_background" in rows[0]:
            entry[f"background_{kind}"] = _mean([row["sceneeval_background"] for row in rows])
    return entry


def sceneeval_summary(rows: list[dict]) -> dict:
    """Mean SceneEval score and its standard error over rows of `sceneeval_rows`, and the per-kind means
    (GenEval's per-task scores) over the rows whose caption states that kind."""
    scores = [row["sceneeval"] for row in rows]
    spread = statistics.stdev(scores) if len(scores) > 1 else None
    entry = {
        "sceneeval": _mean(scores),
        "sceneeval_sem": None if spread is None else spread / len(scores) ** 0.5,
    }
    for kind in (*CHECK_KINDS, BACKGROUND):
        stated = [row[f"sceneeval_{kind}"] for row in rows if row.get(f"sceneeval_{kind}") is not None]
        entry[f"sceneeval_{kind}"] = _mean(stated) if stated else None
    return entry
