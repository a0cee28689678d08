"""Scoring a model set's images on a prompt file (docs/real_evaluation.md), once
`mulo_sd.evaluation.generation.generate`
has written every run's images on every rank. Rank 0 alone runs this.

- Quality, from the images on disk: per run and prompt split, FID against the reference (real images or
  statistics: mulo_sd/evaluation/metrics/fid.py, under the resizing protocol of fid_protocols.py, named in
  every FID output), HPSv2 (metrics/hpsv2.py, also per image in images.csv) and CLIP score
  (metrics/clip_score.py) against the prompts, over every seed's image; GenEval once its scorer has run on
  a run's folder (mulo_sd/evaluation/real_table.py).
- Speed: the batch-1 protocol of mulo_sd/evaluation/harness.py (warm-up, runs interleaved per prompt,
per-prompt
  ratios against AR), quality off, in a pass of its own over the first `speed_prompts` prompts of each split
  at the first seed.
- Throughput: images per second of token generation in the generation pass, at its batch size
  (`throughput_img_s`: the split's images over the sum of their `image_wall_s`).
- Splits: all prompts ("all"), or a seeded dev/test split (`dev_count` dev prompts, the rest test).
- Matched quality with a split: per family the fastest run (batch-1 speedup on the dev prompts) whose
  `metric` lies within `tolerance` of AR's on the dev prompts, reported with its numbers on the disjoint
  test prompts (`matched_split_table`).

DPG-Bench prompts also get every run's grids in DPG-Bench's layout (mulo_sd/evaluation/dpg_format.py).

Writes into out_dir: images.csv (every image's record), runs.csv (the speed pass' rows), summary.csv and
summary.md (one row per run and split), speed_quality.png (test or all split), grid_seed<seed>.png (real
image on top when the prompts have one, then one row per run) and, with `matched`, matched.md; the speed
pass' own files stay in speed/; paper_table.md (the paper's table shape: real_table.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from mulo_sd.decoding.sampling import SamplerConfig
from mulo_sd.evaluation.dpg_format import write_dpg_grids
from mulo_sd.evaluation.generation import run_folders
from mulo_sd.evaluation.harness import Evaluation, evaluate
from mulo_sd.evaluation.matched_quality import matched_runs
from mulo_sd.evaluation.metrics.clip_score import clip_score
from mulo_sd.evaluation.metrics.fid import FIDStatistics, extract_features, frechet_distance
from mulo_sd.evaluation.metrics.fid_protocols import DEFAULT_FID_PROTOCOL, describe
from mulo_sd.evaluation.metrics.hpsv2 import HPSModel, hps_scores
from mulo_sd.evaluation.metrics.images import load_image
from mulo_sd.evaluation.plots import plot_grid, plot_speed_quality
from mulo_sd.evaluation.prompt_sets import PromptRecord, PromptSet, split_dev_test
from mulo_sd.evaluation.real_table import GENEVAL_FOLDER, geneval_score, paper_rows, write_paper_table
from mulo_sd.evaluation.runs import reference_run
from mulo_sd.evaluation.summaries import summarize
from mulo_sd.evaluation.tables import markdown_table
from mulo_sd.evaluation.writers import write_csv
from mulo_sd.testbed.prompts import Prompt

SPEED_COLUMNS = (
    "wall_s_median", "speedup_median", "speedup_of_medians", "sequential_steps_median", "step_ratio_median",
    "target_forwards_mean", "nfe_ratio_median", "acceptance",
)  # fmt: skip
SUMMARY_COLUMNS = (
    "split", "label", "images", "speedup_median", "speedup_of_medians", "step_ratio_median",
    "nfe_ratio_median", "acceptance", "batch_size", "throughput_img_s", "geneval", "fid", "hpsv2",
    "clip_score",
)  # fmt: skip
METRICS = ("geneval", "fid", "hpsv2", "clip_score")


@dataclass
class QualitySetup:
    """The loaded metric models; a metric whose model is None is not computed."""

    fid_extractor: nn.Module | None = None
    fid_reference: FIDStatistics | None = None
    clip: tuple | None = None  # (CLIPModel, CLIPProcessor)
    hps: HPSModel | None = None
    fid_protocol: str = DEFAULT_FID_PROTOCOL  # fid_protocols.py
    fid_resolution: int | None = None  # None: the generated images' size
    batch_size: int = 32
    device: str | torch.device = "cpu"


def prompt_splits(prompts: list[PromptRecord], dev_count: int | None, seed: int = 0) -> dict[str, list]:
    """{"all": prompts}, or {"dev": ..., "test": ...} with `dev_count` dev prompts (split_dev_test)."""
    if not dev_count:
        return {"all": prompts}
    dev, test = split_dev_test(prompts, dev_count, seed)
    return {"dev": dev, "test": test}


def quality_scores(rows: list[dict], splits: dict[str, list], setup: QualitySetup) -> dict[tuple, dict]:
    """(run label, split) -> {"fid" with "fid_protocol", "hpsv2", "clip_score"} (those set up) over the
    split's images of the run; `rows`: gathered image records with their "path" (each gets its own "hpsv2").
    Each image passes the FID extractor once."""
    scores = {}
    for label in dict.fromkeys(row["label"] for row in rows):
        run_rows = [row for row in rows if row["label"] == label]
        paths = [Path(row["path"]) for row in run_rows]
        features = None
        if setup.fid_extractor is not None:
            features = extract_features(
                setup.fid_extractor, paths, setup.fid_resolution, setup.batch_size, setup.device,
                setup.fid_protocol,
            )  # fmt: skip
        if setup.hps is not None:
            captions = [row["prompt"] for row in run_rows]
            scored = hps_scores(setup.hps, paths, captions, setup.batch_size, setup.device)
            for row, score in zip(run_rows, scored, strict=True):
                row["hpsv2"] = score
        for split, prompts in splits.items():
            keep = {p.index for p in prompts}
            chosen = [i for i, row in enumerate(run_rows) if row["prompt_index"] in keep]
            entry = {}
            if features is not None:
                entry["fid"] = frechet_distance(features[chosen], setup.fid_reference)
                entry["fid_protocol"] = describe(setup.fid_protocol, setup.fid_resolution)
            if setup.hps is not None:
                entry["hpsv2"] = sum(run_rows[i]["hpsv2"] for i in chosen) / len(chosen)
            if setup.clip is not None:
                captions = [run_rows[i]["prompt"] for i in chosen]
                entry["clip_score"] = clip_score(
                    setup.clip, [paths[i] for i in chosen], captions, setup.batch_size, setup.device
                )
            scores[label, split] = entry
    return scores


def speed_pass(
    models, runs: list, splits: dict[str, list], count: int, seed: int, sampler: SamplerConfig,
    device: str | torch.device, out_dir: Path, warmup: int = 1, progress: bool = True,
) -> tuple[list[dict], dict[str, list[dict]]]:  # fmt: skip
    """The batch-1 speed protocol on the first `count` prompts of each split: (its rows, split -> summary)."""
    chosen = {split: prompts[:count] for split, prompts in splits.items()}
    union = sorted(
        {p.index: p for prompts in chosen.values() for p in prompts}.values(), key=lambda p: p.index
    )
    # speed only (quality=False, no grid): a prompt needs no attribute record and no real image here
    as_prompts = [Prompt(p.index, p.text, dict(p.metadata), None) for p in union]
    evaluation = evaluate(
        models, runs, as_prompts, [seed], sampler, device, out_dir, warmup=warmup, quality=False,
        grid_prompts=0, progress=progress,
    )  # fmt: skip
    reference = reference_run(runs).label
    summaries = {}
    for split, prompts in chosen.items():
        keep = {p.index for p in prompts}
        summaries[split] = summarize(
            [row for row in evaluation.rows if row["prompt_index"] in keep], reference
        )
    return evaluation.rows, summaries


def summarize_splits(
    runs: list, rows: list[dict], splits: dict[str, list], quality: dict[tuple, dict],
    speed: dict[str, list[dict]] | None,
) -> list[dict]:  # fmt: skip
    """One entry per (split, run): images, batch size and throughput of the generation pass, the speed
    pass' columns (SPEED_COLUMNS) and the quality scores."""
    summary = []
    for split, prompts in splits.items():
        keep = {p.index for p in prompts}
        speed_by_label = {entry["label"]: entry for entry in (speed or {}).get(split, [])}
        for run in runs:
            images = [row for row in rows if row["label"] == run.label and row["prompt_index"] in keep]
            entry = {
                "split": split, "family": run.family, "label": run.label, "method": run.method,
                "knobs": images[0]["knobs"], "images": len(images),
                "batch_size": max(row["batch_size"] for row in images),
                "throughput_img_s": len(images) / sum(row["image_wall_s"] for row in images),
            }  # fmt: skip
            if run.label in speed_by_label:
                entry |= {column: speed_by_label[run.label].get(column) for column in SPEED_COLUMNS}
            summary.append(entry | quality.get((run.label, split), {}))
    return summary


def matched_split_table(
    summary: list[dict], metric: str, tolerance: float, reference: str = "ar"
) -> list[dict]:
    """Per family the run chosen on the dev split (or "all" without a split): the fastest whose `metric` is
    within `tolerance` of the reference's; its numbers from the test split (or "all")."""
    splits = {entry["split"] for entry in summary}
    dev, test = ("dev", "test") if "dev" in splits else ("all", "all")
    picked_on = [entry for entry in summary if entry["split"] == dev]
    reported = {entry["label"]: entry for entry in summary if entry["split"] == test}
    table = []
    for family, chosen in matched_runs(picked_on, reference, tolerance, metric):
        row = {"method": family, "setting": None, f"{metric}_{dev}": None, "speedup": None}
        if chosen is not None:
            label, result = chosen["label"], reported[chosen["label"]]
            setting = label[len(family) :].strip() if label.startswith(family) else label
            row |= {
                "setting": setting or "-", f"{metric}_{dev}": chosen[metric],
                "speedup": result["speedup_median"],
                "speedup_of_medians": result["speedup_of_medians"], "step_ratio": result["step_ratio_median"],
                **{name: result.get(name) for name in METRICS},
            }  # fmt: skip
        table.append(row)
    return table


def write_outputs(
    out_dir: Path, prompt_set: PromptSet, splits: dict[str, list], seeds: list[int], rows: list[dict],
    speed_rows: list[dict], summary: list[dict], header: str, grid_prompts: int, runs: list,
) -> dict[str, Path]:  # fmt: skip
    """images.csv, runs.csv, summary.csv, summary.md, speed_quality.png and the image grid."""
    files = {name: out_dir / f"{name}.csv" for name in ("images", "runs", "summary")}
    write_csv(files["images"], rows)
    if speed_rows:
        write_csv(files["runs"], speed_rows)
    else:
        del files["runs"]
    write_csv(files["summary"], summary)
    tables = "\n\n".join(
        f"## {split} prompts ({len(prompts)})\n\n"
        + markdown_table([e for e in summary if e["split"] == split], SUMMARY_COLUMNS[1:])
        for split, prompts in splits.items()
    )
    files["summary_md"] = out_dir / "summary.md"
    files["summary_md"].write_text(f"# Evaluation on {prompt_set.source.name}\n\n{header}\n\n{tables}\n")
    shown = "test" if "test" in splits else "all"
    plotted = [e for e in summary if e["split"] == shown]
    quality = next((name for name in ("clip_score", "fid") if all(name in e for e in plotted)), None)
    if speed_rows and quality is not None:
        files["speed_quality"] = plot_speed_quality(plotted, out_dir / "speed_quality.png", quality)
    columns = splits[shown][:grid_prompts]
    if columns:
        by_key = {(row["label"], row["prompt_index"], row["seed"]): row for row in rows}
        images = [
            [_signed(load_image(by_key[run.label, p.index, seeds[0]]["path"])) for p in columns]
            for run in runs
        ]
        labels = [run.label for run in runs]
        if all(p.reference is not None for p in columns):
            size = images[0][0].shape[-1]
            images.insert(0, [_signed(load_image(p.reference, size)) for p in columns])
            labels.insert(0, "real")
        captions = [f"#{p.index}: {p.text}" for p in columns]
        files["grid"] = plot_grid(images, labels, captions, out_dir / f"grid_seed{seeds[0]}.png")
    return files


def _signed(image: torch.Tensor) -> torch.Tensor:
    return image.float() / 127.5 - 1


def score_prompt_set(
    models, runs: list, prompt_set: PromptSet, rows: list[dict], seeds: list[int], sampler: SamplerConfig,
    device: str | torch.device, out_dir: str | Path, setup: QualitySetup, *, dev_count: int | None = None,
    split_seed: int = 0, speed_prompts: int = 20, warmup: int = 1, grid_prompts: int = 8,
    world_size: int = 1, progress: bool = True,
) -> Evaluation:  # fmt: skip
    """Quality, speed, throughput and the output files (module docstring); `rows`: the gathered image
    records (mulo_sd.evaluation.generation.gather_records)."""
    out_dir = Path(out_dir)
    splits = prompt_splits(prompt_set.prompts, dev_count, split_seed)
    quality = quality_scores(rows, splits, setup)
    speed_rows, speed = [], None
    if speed_prompts > 0:
        speed_rows, speed = speed_pass(
            models,
            runs,
            splits,
            speed_prompts,
            seeds[0],
            sampler,
            device,
            out_dir / "speed",
            warmup,
            progress,
        )
    summary = summarize_splits(runs, rows, splits, quality, speed)
    add_geneval_scores(summary, runs, splits, out_dir)
    split_note = (
        f"Dev/test split (seed {split_seed}): {len(splits['dev'])} dev prompts pick each method's setting, "
        f"{len(splits['test'])} disjoint test prompts report it."
        if "dev" in splits
        else "No dev/test split: every number is over all prompts."
    )
    batch_sizes = sorted({row["batch_size"] for row in rows})
    speed_note = (
        f"Speed: batch 1, the first {speed_prompts} prompts of each split at seed {seeds[0]}, warm-up "
        f"{warmup}, against '{reference_run(runs).label}'."
        if speed_prompts > 0
        else "No speed pass."
    )
    header = (
        f"{len(prompt_set.prompts)} {prompt_set.format} prompts from {prompt_set.source} x {len(seeds)} "
        f"seed(s) ({len(rows)} images; generation at batch {batch_sizes} on {world_size} rank(s), device "
        f"{device}); "
        f"sampler {sampler}. {speed_note} {split_note}{metric_note(setup)}"
    )
    files = write_outputs(
        out_dir, prompt_set, splits, seeds, rows, speed_rows, summary, header, grid_prompts, runs
    )
    files["paper_table"] = paper_table(out_dir, runs, prompt_set, rows, seeds, splits, summary, header)
    return Evaluation(speed_rows, summary, files)


def metric_note(setup: QualitySetup) -> str:
    """What the header says of the metrics: the FID protocol (always named with an FID) and the HPS file."""
    notes = []
    if setup.fid_extractor is not None:
        notes.append(f" FID protocol: {describe(setup.fid_protocol, setup.fid_resolution)}.")
    if setup.hps is not None:
        notes.append(f" HPSv2: {setup.hps.source.name}.")
    return "".join(notes)


def add_geneval_scores(summary: list[dict], runs: list, splits: dict[str, list], out_dir: Path) -> None:
    """Each summary entry's `geneval` from `<out_dir>/geneval/<run folder>.jsonl`, GenEval's scorer's output
    for the run, when it is there (real_table.py)."""
    results = run_folders(out_dir / GENEVAL_FOLDER, runs)
    for entry in summary:
        path = results[entry["label"]].with_suffix(".jsonl")
        if path.is_file():
            entry["geneval"] = geneval_score(path, {p.index for p in splits[entry["split"]]})


def paper_table(
    out_dir: Path, runs: list, prompt_set: PromptSet, rows: list[dict], seeds: list[int],
    splits: dict[str, list], summary: list[dict], header: str,
) -> Path:  # fmt: skip
    """paper_table.md (printed): per run of the test split (or all) the paper's columns; DPG-Bench prompts
    first get their grids in DPG-Bench's layout (dpg_format.py)."""
    layouts = {"geneval": run_folders(out_dir / "images", runs)}
    if prompt_set.format == "dpg":
        layouts["dpg"] = run_folders(out_dir / "dpg_bench", runs)
        write_dpg_grids(rows, prompt_set.prompts, seeds, layouts["dpg"])
    split = "test" if "test" in splits else "all"
    table = paper_rows(summary, split, layouts)
    count = len(splits[split])
    where = f"the {count} test prompts" if split == "test" else f"all {count} prompts"
    note = f"# The paper's table ({where})\n\n{header}"
    path = out_dir / "paper_table.md"
    print(write_paper_table(path, table, note))
    return path
