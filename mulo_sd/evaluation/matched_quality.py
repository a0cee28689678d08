"""The paper's matched-quality protocol (docs/evaluation.md section 5): per method family the fastest run
whose quality matches the reference's, chosen on dev prompts and reported on test prompts when the summary
has both.
"""

from __future__ import annotations

from mulo_sd.evaluation.fd_minimum import BELOW, MINIMUM
from mulo_sd.evaluation.runs import REFERENCE_METHOD
from mulo_sd.evaluation.texture import SCORES

MATCHED_COLUMNS = (
    "method", "setting", "sceneeval_dev", "d_sceneeval_dev", "speedup", "speedup_of_medians", "step_ratio",
    "sceneeval", "d_sceneeval", "fd", "fd_ratio", "fd_ar", "texture", "texture_ratio", "d_texture",
    "texture_gap", "pattern", "pattern_ratio", "d_pattern", "pattern_gap", "nll", "d_nll",
)  # fmt: skip
MATCH_RULES = ("interval", "tolerance")
# each texture statistic's summary columns, carried into its row as they are
TEXTURE_COLUMNS = tuple(
    column for s in SCORES for column in (s, f"{s}_ratio", f"d_{s}", f"d_{s}_lo", f"d_{s}_hi", f"{s}_gap")
)


def matched_quality_table(
    summary: list[dict], reference: str = REFERENCE_METHOD, *, rule: str = "interval",
    tolerance: float | None = None,
) -> list[dict]:  # fmt: skip
    """The paper's matched-quality protocol: the reference row (method or label `reference`), then for every
    other family the fastest run (highest median per-prompt speedup) whose SceneEval score matches the
    reference's. `rule` "interval": the 95% bootstrap interval of the paired SceneEval difference to the
    reference contains 0; "tolerance": the mean score lies within `tolerance` of the reference's, on either
    side. A family with no such run gets setting None and no numbers. With dev and test entries in the
    summary (a `split` column) the run is chosen on dev and reported with its test numbers (its dev score and
    difference in `sceneeval_dev`, `d_sceneeval_dev`).

    Two-sided because every method samples from the same target: a score far above the target's own is a
    drift away from its distribution (ZipAR with a small window smears colour, which the colour and object
    checks reward), not a quality the method adds, and would let such a run stand in for the target."""
    if not all("sceneeval" in entry for entry in summary):
        raise ValueError(
            "matched quality needs SceneEval scores in the summary (evaluate with the sceneeval model)"
        )
    splits = {entry.get("split") for entry in summary}
    dev, test = ("dev", "test") if {"dev", "test"} <= splits else (None, None)
    picked_on = [entry for entry in summary if dev is None or entry["split"] == dev]
    reported = {entry["label"]: entry for entry in summary if test is None or entry["split"] == test}
    table = []
    for family, chosen in matched_runs(picked_on, reference, tolerance, rule=rule):
        row = _matched_row(family, None if chosen is None else reported[chosen["label"]])
        if dev is not None:
            dev_columns = {"sceneeval_dev": "sceneeval", "d_sceneeval_dev": "d_sceneeval"}
            dev_columns |= {f"d_sceneeval_dev_{b}": f"d_sceneeval_{b}" for b in ("lo", "hi")}
            row |= {
                name: None if chosen is None else chosen.get(column) for name, column in dev_columns.items()
            }
        table.append(row)
    return table


def matched_runs(
    summary: list[dict], reference: str = REFERENCE_METHOD, tolerance: float | None = 0.0,
    metric: str = "sceneeval", rule: str = "tolerance",
) -> list[tuple[str, dict | None]]:  # fmt: skip
    """(family, chosen summary entry or None) per family, the reference family first: the selection of
    `matched_quality_table`, on any quality column `metric` of the summary (rule "interval": on its paired
    difference's interval d_<metric>_lo .. d_<metric>_hi)."""
    if rule not in MATCH_RULES:
        raise ValueError(f"matched.rule must be one of {MATCH_RULES}, got {rule!r}")
    if rule == "tolerance" and (tolerance is None or tolerance < 0):
        raise ValueError(f"rule 'tolerance' needs a tolerance >= 0 ({metric} points), got {tolerance}")
    if rule == "interval" and tolerance is not None:
        raise ValueError(f"tolerance {tolerance} applies to rule 'tolerance' only; rule 'interval' has none")
    needed = [metric] if rule == "tolerance" else [f"d_{metric}_lo", f"d_{metric}_hi"]
    missing = [entry["label"] for entry in summary if any(entry.get(name) is None for name in needed)]
    if missing:
        what = "" if rule == "tolerance" else " (an interval needs at least 2 prompts)"
        names = " and ".join(f"'{name}'" for name in needed)
        raise ValueError(f"matched quality needs {names} in every summary row{what}; missing for {missing}")
    matches = [entry for entry in summary if reference in (entry["method"], entry["label"])]
    if len(matches) != 1:
        raise ValueError(f"reference '{reference}' must name exactly one summary row, got {len(matches)}")
    base = matches[0]
    if rule == "interval" and base["method"] != REFERENCE_METHOD:
        raise ValueError(
            f"rule 'interval' reads the paired differences to {REFERENCE_METHOD}, not to '{reference}': "
            "match another run (e.g. LANTERN's) with rule 'tolerance'"
        )

    def matches_base(entry: dict) -> bool:
        if rule == "interval":
            return entry[f"d_{metric}_lo"] <= 0 <= entry[f"d_{metric}_hi"]
        return abs(entry[metric] - base[metric]) <= tolerance

    families = list(dict.fromkeys(entry["family"] for entry in summary if entry["family"] != base["family"]))
    chosen = [(base["family"], base)]
    for family in families:
        within = [entry for entry in summary if entry["family"] == family and matches_base(entry)]
        chosen.append((family, max(within, key=lambda entry: entry["speedup_median"], default=None)))
    return chosen


def _matched_row(family: str, entry: dict | None) -> dict:
    if entry is None:
        return {"method": family, **dict.fromkeys(MATCHED_COLUMNS[1:])}
    setting = entry["label"][len(family) :].strip() if entry["label"].startswith(family) else entry["label"]
    return {
        "method": family, "setting": setting or "-", "speedup": entry["speedup_median"],
        "speedup_lo": entry.get("speedup_lo"), "speedup_hi": entry.get("speedup_hi"),
        "speedup_of_medians": entry["speedup_of_medians"], "step_ratio": entry["step_ratio_median"],
        "sceneeval": entry["sceneeval"], "d_sceneeval": entry.get("d_sceneeval"),
        "d_sceneeval_lo": entry.get("d_sceneeval_lo"), "d_sceneeval_hi": entry.get("d_sceneeval_hi"),
        "fd": entry.get("fd"), "fd_ratio": entry.get("fd_ratio"), "fd_ratio_lo": entry.get("fd_ratio_lo"),
        "fd_ratio_hi": entry.get("fd_ratio_hi"), "fd_ar": entry.get("fd_ar"),
        **{column: entry.get(column) for column in TEXTURE_COLUMNS}, "nll": entry.get("nll_mean"),
        "d_nll": entry.get("d_nll"), "d_nll_lo": entry.get("d_nll_lo"), "d_nll_hi": entry.get("d_nll_hi"),
        MINIMUM: entry.get(MINIMUM), BELOW: entry.get(BELOW),
    }  # fmt: skip
