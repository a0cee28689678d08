"""The files of the speed/quality harness (docs/evaluation.md section 6): runs.csv, summary.csv, summary.md,
references.csv, speed_quality.png, ablations.png and the image grid.
"""

from __future__ import annotations

import csv
from pathlib import Path

from mulo_sd.decoding.sampling import SamplerConfig
from mulo_sd.evaluation.plots import plot_grid, plot_speed_quality
from mulo_sd.evaluation.runs import RunSpec
from mulo_sd.evaluation.summaries import reported_splits
from mulo_sd.evaluation.tables import (
    INTERVAL_NOTE,
    ablation_groups,
    ablation_tables,
    background_kind_table,
    markdown_table,
    paired_table,
    plot_ablations,
)
from mulo_sd.testbed.prompts import Prompt
from mulo_sd.testbed.scene_checks import BACKGROUND, CHECK_KINDS
from mulo_sd.testbed.synthscenes import BACKGROUNDS

SCENEEVAL_KINDS = tuple(f"sceneeval_{kind}" for kind in (*CHECK_KINDS, BACKGROUND))
SUMMARY_COLUMNS = (
    "label", "images", "wall_s_median", "speedup_median", "speedup_compiled_ar_median", "speedup_of_medians",
    "sequential_steps_median",
    "step_ratio_median", "target_forwards_mean", "nfe_ratio_median", "acceptance", "nll_mean", "sceneeval",
    "sceneeval_sem", *SCENEEVAL_KINDS, "fd", "fd_ratio", "fd_ar", "texture",
    "texture_ratio", "d_texture", "texture_gap", "pattern", "pattern_ratio", "d_pattern", "pattern_gap",
    "d_sceneeval_background",
)  # fmt: skip
REFERENCE_COLUMNS = (
    "label", "images", "sceneeval", "sceneeval_sem", *SCENEEVAL_KINDS, "fd",
    "fd_ar", "texture", "pattern",
)  # fmt: skip


def write_outputs(
    out_dir: Path, rows: list[dict], summary: list[dict], references: list[dict], runs: list[RunSpec],
    reference: RunSpec, prompts: list[Prompt], seeds: list[int], sampler: SamplerConfig, device, warmup: int,
    shown: list[Prompt], grid: dict,
) -> dict[str, Path]:  # fmt: skip
    """runs.csv, summary.csv, summary.md, references.csv, speed_quality.png, ablations.png and the grid
    (grid: (run label, column) -> image of a `shown` prompt)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {name: out_dir / f"{name}.csv" for name in ("runs", "summary")}
    write_csv(files["runs"], rows)
    write_csv(files["summary"], summary)
    splits = list(dict.fromkeys(entry["split"] for entry in summary))
    shown_entries = [entry for entry in summary if entry["split"] == reported_splits(splits)[0]]
    groups = ablation_groups(runs)
    if groups:
        files["ablations"] = plot_ablations(shown_entries, groups, reference.label, out_dir / "ablations.png")
    if references:
        files["references"] = out_dir / "references.csv"
        write_csv(files["references"], references)
    counts = {split: sum(p.split == split for p in prompts) for split in splits}
    named = ", ".join(f"{counts[split]} {split}" for split in splits)
    header = (
        f"{named} prompts x {len(seeds)} seed(s), batch 1, device {device}, warm-up {warmup}; "
        f"sampler {sampler}; speedups against '{reference.label}'."
    )
    files["summary_md"] = out_dir / "summary.md"
    files["summary_md"].write_text(
        summary_markdown(header, summary, counts, groups, reference.label, references)
    )
    files["speed_quality"] = plot_speed_quality(shown_entries, out_dir / "speed_quality.png")
    if shown:
        images = [[p.image for p in shown]]
        images += [[grid[run.label, i] for i in range(len(shown))] for run in runs]
        labels = ["real (held-out)"] + [run.label for run in runs]
        captions = [f"#{p.index}: {p.caption}" for p in shown]
        files["grid"] = plot_grid(images, labels, captions, out_dir / f"grid_seed{seeds[0]}.png")
    return files


def summary_markdown(
    header: str, summary: list[dict], counts: dict[str, int], groups: dict[str, list[str]], reference: str,
    references: list[dict],
) -> str:  # fmt: skip
    """summary.md: the summary table per split (counts: split -> prompts, in split order), then on the first
    reported split every run against the reference run (label `reference`), the ablation tables (groups:
    tables.ablation_groups) and the reference rows."""
    splits = list(counts)
    reported = reported_splits(splits)
    sections = []
    for split in splits:
        entries = [entry for entry in summary if entry["split"] == split]
        title = f"## {split} prompts ({counts[split]})\n\n" if len(splits) > 1 else ""
        sections.append(f"{title}{markdown_table(entries, SUMMARY_COLUMNS)}")
    shown_entries = [entry for entry in summary if entry["split"] == reported[0]]
    sections.append(
        f"## Against {reference} ({reported[0]} prompts)\n\nPaired per (prompt, seed) with "
        f"'{reference}'; {INTERVAL_NOTE}.\n\n{paired_table(shown_entries)}"
    )
    if any(f"d_pattern_{kind}" in entry for entry in shown_entries for kind in BACKGROUNDS):
        sections.append(
            f"## Pattern by background kind ({reported[0]} prompts)\n\nThe means over all images let "
            f"blotches over gradients offset stripes lost; per kind of background the caption names, each "
            f"run's pattern, its and the texture's paired differences to '{reference}' and the kind's "
            f"background accuracy; "
            f"{INTERVAL_NOTE}.\n\n{background_kind_table(shown_entries)}"
        )
    if groups:
        sections.append(
            f"## Ablations ({reported[0]} prompts)\n\n{INTERVAL_NOTE}.\n\n"
            f"{ablation_tables(shown_entries, groups, reference)}"
        )
    if references:
        sections.append(
            f"## References ({reported[0]} prompts)\n\nThe held-out images of the same prompts, their "
            f"tokenizer round trips and, with fd_ar, AR under the other seeds (fd: FD to the real images; "
            f"fd_ar: FD to AR under the other seeds; texture: mean RMS luma contrast of detail finer "
            f"than 32 px, percent; pattern: the part of it in the 32 strongest frequencies)"
            f":\n\n{markdown_table(references, REFERENCE_COLUMNS)}"
        )
    body = "\n\n".join(sections)
    return f"# Evaluation\n\n{header}\n\n{body}\n"


def write_csv(path: Path, rows: list[dict]) -> None:
    """Rows with possibly different keys (phase timings differ between methods): the union as columns."""
    columns = list(dict.fromkeys(key for row in rows for key in row))
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
