"""The speed/quality harness (docs/evaluation.md): every run (a method with its knobs) decodes every prompt
with the same fixed seeds, side by side in one process, batch 1.

Protocol:
- warm-up: each run decodes the first prompt `warmup` times first (allocations, kernels; results dropped);
- interleaving: for each prompt and seed, every run decodes once before the next prompt starts, in an order
  rotated by one per prompt, so machine noise (other jobs, clock changes) hits all runs alike;
- speed: `wall_s` is the decode's token-generation time (DecodeStats.wall_seconds; the image decode is left
  out, it is the same for every method). Per (prompt, seed), speedup = AR wall / run wall, step_ratio = AR
  sequential steps / run sequential steps, nfe_ratio = AR target forwards / run target forwards. A run's
  summary gives the median of its per-prompt ratios and, for speed, also the ratio of the medians;
- quality (`quality=True`): `nll` = the target's mean negative log-likelihood of the produced tokens (one
  teacher-forced forward with the prompt's caption, conditional, no guidance: how far a method drifts from the
  target's own distribution; plain AR is the reference); with SceneEval loaded, `sceneeval` = the fraction of
  the prompt's checks the image passes (mean over prompts in the summary), `sceneeval_<kind>` the same for
  one kind of check (object, count, colour, relation: GenEval's per-task scores, mean over the prompts that
  state that kind) and `fd` = Frechet distance of the run's images to the real held-out images of the same
  prompts, in SceneEval feature space;
- paired with AR (mulo_sd/evaluation/paired.py): per (prompt, seed) `d_sceneeval` and `d_nll`, the difference
to AR's
  decode of the same prompt and seed; a run's summary gives their means and, like the median speedup, a
  bootstrap interval (`_lo`, `_hi`) over the prompts;
- FD ratio (mulo_sd/evaluation/fd_ratio.py): `fd_ratio` = a run's FD over AR's, with a bootstrap interval
over the
  prompts on the reported split;
- FD to AR (`fd_ar_seeds`): AR decodes every reported prompt once more per extra seed; `fd_ar` is the FD of
  a run's images to those, and AR's own `fd_ar` (AR under other seeds) the floor;
- splits: prompts carry their split (mulo_sd/testbed/prompts.py); every summary entry is one (split, run).

Writes into out_dir: runs.csv (one row per run, prompt, seed), summary.csv and summary.md (one row per split
and run, the table against AR, one table per ablation; with SceneEval also references.csv, the same quality
columns for the real images, their round trips and AR under the other seeds), speed_quality.png (speedup
against quality, one curve per family over its knob sweep), ablations.png (with ablation runs) and
grid_seed<seed>.png (rows: real image, then one per run; columns: the first reported prompts).
`matched_quality_table` applies the paper's matched-quality protocol to a summary (`matched_runs`: its
selection, on any quality column).
"""

from __future__ import annotations

import csv
import json
import statistics
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from mulo_sd.decoding.sampling import SamplerConfig
from mulo_sd.evaluation.fd_ratio import fd_ratio_intervals
from mulo_sd.evaluation.paired import BOOTSTRAP, Bootstrap, interval, per_seed_samples
from mulo_sd.evaluation.tables import (
    INTERVAL_NOTE,
    ablation_groups,
    ablation_tables,
    markdown_table,
    paired_table,
    plot_ablations,
)
from mulo_sd.pipeline.decode_entry import decode, required_models, resolve_knobs
from mulo_sd.pipeline.model_set import Models
from mulo_sd.pipeline.run_models import check_folders, with_folders
from mulo_sd.testbed.prompts import Prompt
from mulo_sd.testbed.sceneeval import (
    CHECK_KINDS,
    check_results,
    frechet_distance,
    kind_scores,
    prompt_scores,
    scene_features,
)

REFERENCE_METHOD = "ar"
SUMMARY_COLUMNS = (
    "label", "images", "wall_s_median", "speedup_median", "speedup_of_medians", "sequential_steps_median",
    "step_ratio_median", "target_forwards_mean", "nfe_ratio_median", "acceptance", "nll_mean", "sceneeval",
    "sceneeval_sem", *(f"sceneeval_{kind}" for kind in CHECK_KINDS), "fd", "fd_ratio", "fd_ar",
)  # fmt: skip
REFERENCE_COLUMNS = (
    "label", "images", "sceneeval", "sceneeval_sem", *(f"sceneeval_{kind}" for kind in CHECK_KINDS), "fd",
    "fd_ar",
)  # fmt: skip
MATCHED_COLUMNS = (
    "method", "setting", "sceneeval_dev", "d_sceneeval_dev", "speedup", "speedup_of_medians", "step_ratio",
    "sceneeval", "d_sceneeval", "fd", "fd_ratio", "fd_ar", "nll", "d_nll",
)  # fmt: skip
PAIRED = ("sceneeval", "nll")  # per-decode scores differenced with the reference decode (d_<score>)
MATCH_RULES = ("interval", "tolerance")
ENTRY_KEYS = ("method", "family", "label", "knobs", "sweep", "folders", "ablation")
OTHER_SEEDS = "AR (other seeds)"


@dataclass
class RunSpec:
    """One operating point: `method` with `knobs`. `family` groups a knob sweep into one curve / table row
    (default: the method); `label` names the run uniquely (default: family and knobs); `folders` (role ->
    folder) gives the run its own model for a role (mulo_sd/pipeline/run_models.py); `ablations` names the
    ablation
    tables the run appears in."""

    method: str
    knobs: dict = field(default_factory=dict)
    family: str = ""
    label: str = ""
    folders: dict = field(default_factory=dict)
    ablations: tuple[str, ...] = ()

    def __post_init__(self):
        resolve_knobs(self.method, self.knobs)  # a bad method or knob fails before anything is decoded
        self.family = self.family or self.method
        self.label = self.label or " ".join([self.family, *(f"{k}={v}" for k, v in self.knobs.items())])
        check_folders(self.label, self.folders, required_models(self.method, self.knobs))


def expand_runs(entries: list[dict]) -> list[RunSpec]:
    """Run specs from config entries `{method, family?, label?, knobs?, sweep?: {knob: [values]}, folders?:
    {role: folder}, ablation?: name or [names]}`; a sweep (one knob) gives one run per value, labelled
    '<family> <knob>=<value>'; `label` names a run without a sweep."""
    runs = []
    for entry in entries:
        unknown = sorted(set(entry) - set(ENTRY_KEYS))
        if unknown or "method" not in entry:
            raise ValueError(f"a run entry has keys {', '.join(ENTRY_KEYS)} (method required), got {entry}")
        knobs, family = dict(entry.get("knobs") or {}), entry.get("family") or entry["method"]
        sweep, folders = dict(entry.get("sweep") or {}), dict(entry.get("folders") or {})
        ablations = entry.get("ablation") or ()
        ablations = (ablations,) if isinstance(ablations, str) else tuple(ablations)
        if len(sweep) > 1:
            raise ValueError(f"a run entry sweeps one knob, got {sorted(sweep)} for family '{family}'")
        if sweep and entry.get("label"):
            raise ValueError(
                f"a run entry with a sweep is labelled by its values, not label '{entry['label']}'"
            )
        if not sweep:
            runs.append(RunSpec(entry["method"], knobs, family, entry.get("label") or "", folders, ablations))
            continue
        ((name, values),) = sweep.items()
        for value in values:
            label = f"{family} {name}={value}"
            runs.append(RunSpec(entry["method"], {**knobs, name: value}, family, label, folders, ablations))
    return runs


def reference_run(runs: list[RunSpec]) -> RunSpec:
    """The single plain-AR run every speedup is measured against."""
    references = [run for run in runs if run.method == REFERENCE_METHOD]
    if len(references) != 1:
        raise ValueError(
            f"the run set needs exactly one '{REFERENCE_METHOD}' run (the speed reference), got "
            f"{[run.label for run in references]}"
        )
    labels = [run.label for run in runs]
    duplicates = sorted({label for label in labels if labels.count(label) > 1})
    if duplicates:
        raise ValueError(f"run labels must be unique, got {duplicates} more than once")
    return references[0]


@torch.inference_mode()
def token_nll(
    target, tokens: torch.Tensor, cond: torch.Tensor, cond_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Mean NLL [B] of grids tokens [B, h, w] under the target, teacher-forced with condition `cond` (and
    its mask, for T5 features: Models.condition)."""
    tokens = tokens.reshape(tokens.shape[0], -1).to(target.device)
    keep = torch.zeros(tokens.shape[0], dtype=torch.bool, device=target.device)
    logits = target(tokens, cond, cond_mask, drop=keep)
    return F.cross_entropy(logits.float().transpose(1, 2), tokens, reduction="none").mean(1).cpu()


@dataclass
class Evaluation:
    rows: list[dict]  # one per (run, prompt, seed): what runs.csv holds
    summary: list[dict]  # one per run: what summary.csv holds
    files: dict[str, Path]
    references: list[dict] = field(default_factory=list)  # real images and round trips: references.csv


def evaluate(
    models: Models,
    runs: list[RunSpec],
    prompts: list[Prompt],
    seeds: list[int],
    sampler: SamplerConfig,
    device: str | torch.device,
    out_dir: str | Path,
    warmup: int = 1,
    quality: bool = True,
    grid_prompts: int = 8,
    progress: bool = True,
    fd_ar_seeds: list[int] = (),
    bootstrap: Bootstrap = BOOTSTRAP,
) -> Evaluation:
    """Run the protocol of the module docstring and write its files. SceneEval scores and FD are computed
    when `quality` and `models.sceneeval` is loaded; the NLL whenever `quality`. `progress` shows a bar of the
    decodes done (stderr) with the run being decoded. `fd_ar_seeds` (needs SceneEval): AR's extra seeds for
    `fd_ar`, decoded on the reported prompts (the test split when there is a dev split, else all); disjoint
    from `seeds` for the floor to mean anything (mulo-eval refuses an overlap)."""
    reference = reference_run(runs)
    if not prompts or not seeds:
        raise ValueError(f"need at least one prompt and one seed, got {len(prompts)} and {len(seeds)}")
    target, wanted = models.require("target"), torch.device(device)
    if target.device.type != wanted.type or wanted.index not in (None, target.device.index):
        raise ValueError(f"the models are on {target.device}, not on the evaluation device {device}")
    scorer = models.sceneeval if quality else None
    if fd_ar_seeds and scorer is None:
        raise ValueError(
            "fd_ar_seeds needs quality=True and the sceneeval model: FD-to-AR is FD on its features"
        )
    run_models = {
        run.label: with_folders(models, run.folders, run.label) if run.folders else models for run in runs
    }
    for run in runs:
        for _ in range(warmup):
            decode(run.method, run_models[run.label], [prompts[0].caption], run.knobs, sampler, seeds[0])
    splits = list(dict.fromkeys(p.split for p in prompts))
    reported = [split for split in splits if split != "dev"] or splits
    shown = [p for p in prompts if p.split == reported[0]][:grid_prompts]
    column = {(p.split, p.index): n for n, p in enumerate(shown)}  # grid column of a shown prompt
    extra = [p for p in prompts if p.split in reported] if fd_ar_seeds else []
    keys = {(p.split, p.index) for p in extra}
    rows, other_rows, features, grid = [], [], {}, {}
    bar = tqdm(
        total=len(prompts) * len(seeds) * len(runs) + len(extra) * len(fd_ar_seeds), unit="decode",
        disable=not progress, file=sys.stderr,
    )  # fmt: skip
    for i, prompt in enumerate(prompts):
        cond, cond_mask = models.condition([prompt.caption])
        where = f"{prompt.split} prompt {i + 1}/{len(prompts)}"
        for seed in seeds:
            for run in runs[i % len(runs) :] + runs[: i % len(runs)]:
                bar.set_postfix_str(f"{where}, seed {seed}: {run.label}", refresh=False)
                result = decode(run.method, run_models[run.label], [prompt.caption], run.knobs, sampler, seed)
                row = {
                    "family": run.family, "label": run.label, "method": run.method,
                    "knobs": json.dumps(run.knobs, sort_keys=True), "split": prompt.split,
                    "prompt_index": prompt.index, "prompt": prompt.caption, "seed": seed,
                    "device": str(device), **result.stats.as_dict(),
                }  # fmt: skip
                if quality:
                    row["nll"] = float(token_nll(target, result.tokens, cond, cond_mask)[0])
                if scorer is not None:
                    row |= sceneeval_rows(scorer, result.image, [prompt.caption])[0]
                    decodes = features.setdefault((run.label, prompt.split), {})
                    decodes[prompt.index, seed] = scene_features(scorer, result.image)
                if (prompt.split, prompt.index) in column and seed == seeds[0]:
                    grid[run.label, column[prompt.split, prompt.index]] = result.image[0].cpu()
                rows.append(row)
                bar.update()
        for seed in fd_ar_seeds if (prompt.split, prompt.index) in keys else ():
            bar.set_postfix_str(f"{where}, seed {seed}: {OTHER_SEEDS}", refresh=False)
            ar_models = run_models[reference.label]
            result = decode(reference.method, ar_models, [prompt.caption], reference.knobs, sampler, seed)
            other_rows.append(sceneeval_rows(scorer, result.image, [prompt.caption])[0])
            decodes = features.setdefault((OTHER_SEEDS, prompt.split), {})
            decodes[prompt.index, seed] = scene_features(scorer, result.image)
            bar.update()
    bar.close()
    order = {run.label: n for n, run in enumerate(runs)}
    rows.sort(key=lambda row: order[row["label"]])  # stable: prompts and seeds stay in decoding order
    add_ratios(rows, reference.label)
    summary = [
        entry for split in splits
        for entry in summarize([row for row in rows if row["split"] == split], reference.label, bootstrap)
    ]  # fmt: skip
    references = []
    if scorer is not None:
        real = {
            split: scene_features(scorer, torch.stack([p.image for p in prompts if p.split == split]))
            for split in splits
        }
        pooled = {key: torch.cat(list(value.values())) for key, value in features.items()}
        for entry in summary:
            own = pooled[entry["label"], entry["split"]]
            entry["fd"] = frechet_distance(real[entry["split"]], own)
            if (OTHER_SEEDS, entry["split"]) in pooled:
                entry["fd_ar"] = frechet_distance(pooled[OTHER_SEEDS, entry["split"]], own)
        add_fd_ratios(summary, features, real, prompts, reference.label, reported, bootstrap)
        split = reported[0]
        other = None
        if other_rows:
            other = (other_rows, pooled[OTHER_SEEDS, split], pooled[reference.label, split])
        references = reference_quality(
            scorer, models.require("vq"), [p for p in prompts if p.split == split], real[split], other
        )
    files = write_outputs(
        Path(out_dir), rows, summary, references, runs, reference, prompts, seeds, sampler, device, warmup,
        shown, grid,
    )  # fmt: skip
    return Evaluation(rows, summary, files, references)


def write_outputs(
    out_dir: Path, rows: list[dict], summary: list[dict], references: list[dict], runs: list[RunSpec],
    reference: RunSpec, prompts: list[Prompt], seeds: list[int], sampler: SamplerConfig, device, warmup: int,
    shown: list[Prompt], grid: dict,
) -> dict[str, Path]:  # fmt: skip
    """runs.csv, summary.csv, summary.md, references.csv, speed_quality.png, ablations.png and the grid."""
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {name: out_dir / f"{name}.csv" for name in ("runs", "summary")}
    write_csv(files["runs"], rows)
    write_csv(files["summary"], summary)
    splits = list(dict.fromkeys(entry["split"] for entry in summary))
    reported = [split for split in splits if split != "dev"] or splits
    counts = {split: sum(p.split == split for p in prompts) for split in splits}
    named = ", ".join(f"{counts[split]} {split}" for split in splits)
    header = (
        f"{named} prompts x {len(seeds)} seed(s), batch 1, device {device}, warm-up {warmup}; "
        f"sampler {sampler}; speedups against '{reference.label}'."
    )
    sections = []
    for split in splits:
        entries = [entry for entry in summary if entry["split"] == split]
        title = f"## {split} prompts ({counts[split]})\n\n" if len(splits) > 1 else ""
        sections.append(f"{title}{markdown_table(entries, SUMMARY_COLUMNS)}")
    shown_entries = [entry for entry in summary if entry["split"] == reported[0]]
    sections.append(
        f"## Against {reference.label} ({reported[0]} prompts)\n\nPaired per (prompt, seed) with "
        f"'{reference.label}'; {INTERVAL_NOTE}.\n\n{paired_table(shown_entries)}"
    )
    groups = ablation_groups(runs)
    if groups:
        sections.append(
            f"## Ablations ({reported[0]} prompts)\n\n{INTERVAL_NOTE}.\n\n"
            f"{ablation_tables(shown_entries, groups, reference.label)}"
        )
        files["ablations"] = plot_ablations(shown_entries, groups, reference.label, out_dir / "ablations.png")
    if references:
        files["references"] = out_dir / "references.csv"
        write_csv(files["references"], references)
        sections.append(
            f"## References ({reported[0]} prompts)\n\nThe held-out images of the same prompts, their "
            f"tokenizer round trips and, with fd_ar, AR under the other seeds (fd: FD to the real images; "
            f"fd_ar: FD to AR under the other seeds):\n\n{markdown_table(references, REFERENCE_COLUMNS)}"
        )
    files["summary_md"] = out_dir / "summary.md"
    body = "\n\n".join(sections)
    files["summary_md"].write_text(f"# Evaluation\n\n{header}\n\n{body}\n")
    files["speed_quality"] = plot_speed_quality(shown_entries, out_dir / "speed_quality.png")
    if shown:
        images = [[p.image for p in shown]]
        images += [[grid[run.label, i] for i in range(len(shown))] for run in runs]
        labels = ["real (held-out)"] + [run.label for run in runs]
        captions = [f"#{p.index}: {p.caption}" for p in shown]
        files["grid"] = plot_grid(images, labels, captions, out_dir / f"grid_seed{seeds[0]}.png")
    return files


def add_ratios(rows: list[dict], reference: str) -> None:
    """Add speedup, step_ratio and nfe_ratio to every row: the reference run's (label `reference`) wall time,
    sequential steps and target forwards for the same prompt and seed over the row's own; and for each score
    of PAIRED the rows carry, d_<score> = the row's score - the reference decode's."""
    base = {
        (row.get("split"), row["prompt_index"], row["seed"]): row for row in rows if row["label"] == reference
    }
    for row in rows:
        key = (row.get("split"), row["prompt_index"], row["seed"])
        if key not in base:
            where = f" ({key[0]} split)" if key[0] else ""
            raise ValueError(
                f"no '{reference}' row for prompt {key[1]}{where}, seed {key[2]}: cannot form its ratios"
            )
        ref = base[key]
        row["speedup"] = ref["wall_s"] / row["wall_s"]
        row["step_ratio"] = ref["sequential_steps"] / row["sequential_steps"]
        row["nfe_ratio"] = ref["target_forwards"] / row["target_forwards"]
        for score in PAIRED:
            if score in row and score in ref:
                row[f"d_{score}"] = row[score] - ref[score]


def add_fd_ratios(
    summary: list[dict], features: dict, real: dict, prompts: list[Prompt], reference: str,
    reported: list[str], bootstrap: Bootstrap,
) -> None:  # fmt: skip
    """Every summary entry's `fd_ratio` (its FD over the reference run's, same split) and, on the reported
    splits, its interval `fd_ratio_lo` .. `fd_ratio_hi` (mulo_sd/evaluation/fd_ratio.py). features: (label,
    split) ->
    {(prompt index, seed): features}; real: split -> features of the split's real images in prompt order."""
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
        first = runs[0]
        wall_median = statistics.median(row["wall_s"] for row in runs)
        drafted = sum(row["tokens_drafted"] for row in runs)
        low, high = interval(per_seed_samples(runs, "speedup"), np.median, bootstrap)
        entry = {
            "split": first.get("split", "all"), "family": first["family"], "label": label,
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
        if "nll" in first:
            entry["nll_mean"] = _mean([row["nll"] for row in runs])
        if "sceneeval" in first:
            entry |= sceneeval_summary(runs)
        for score in PAIRED:
            if f"d_{score}" in first:
                samples = per_seed_samples(runs, f"d_{score}")
                low, high = interval(samples, np.mean, bootstrap)
                entry |= {f"d_{score}": float(np.concatenate(samples).mean()), f"d_{score}_lo": low,
                          f"d_{score}_hi": high}  # fmt: skip
        summary.append(entry)
    return summary


def sceneeval_rows(scorer, images: torch.Tensor, captions: list[str]) -> list[dict]:
    """Per image: `sceneeval` (its prompt score) and `sceneeval_<kind>` for each kind its caption states."""
    results = check_results(*scorer.predict(images), captions)
    return [
        {"sceneeval": float(total)} | {f"sceneeval_{kind}": value for kind, value in kinds.items()}
        for total, kinds in zip(prompt_scores(results), kind_scores(results), strict=True)
    ]


def sceneeval_summary(rows: list[dict]) -> dict:
    """Mean SceneEval score and its standard error over rows of `sceneeval_rows`, and the per-kind means
    (GenEval's per-task scores) over the rows whose caption states that kind."""
    scores = [row["sceneeval"] for row in rows]
    spread = statistics.stdev(scores) if len(scores) > 1 else None
    entry = {
        "sceneeval": _mean(scores),
        "sceneeval_sem": None if spread is None else spread / len(scores) ** 0.5,
    }
    for kind in CHECK_KINDS:
        stated = [row[f"sceneeval_{kind}"] for row in rows if row.get(f"sceneeval_{kind}") is not None]
        entry[f"sceneeval_{kind}"] = _mean(stated) if stated else None
    return entry


@torch.no_grad()
def reference_quality(
    scorer, tokenizer, prompts: list[Prompt], real_features: torch.Tensor, other: tuple | None = None
) -> list[dict]:
    """SceneEval of the prompts' real held-out images and of their tokenizer round trips (encode, decode):
    what a perfect target would score, and the most any method can score through this tokenizer.
    real_features: `scene_features` of the real images, which the runs' FD already needed. `other`: (the
    sceneeval rows of AR's decodes under the fd_ar seeds, their features, the AR run's features) adds the
    row "AR (other seeds)" and every row's fd_ar (FD to those decodes; that row's own: to the AR run)."""
    real = torch.stack([p.image for p in prompts]).to(next(tokenizer.parameters()).device)
    round_trip = tokenizer.decode(tokenizer.encode(real)).clamp(-1, 1)
    captions = [p.caption for p in prompts]
    entries = []
    references = (
        ("real images", sceneeval_rows(scorer, real, captions), real_features),
        (
            "tokenizer round trip",
            sceneeval_rows(scorer, round_trip, captions),
            scene_features(scorer, round_trip),
        ),
    )
    if other is not None:
        references += ((OTHER_SEEDS, other[0], other[1]),)
    for label, rows, features in references:
        entry = {"label": label, "images": len(rows), **sceneeval_summary(rows)}
        entry["fd"] = frechet_distance(real_features, features)
        if other is not None:
            entry["fd_ar"] = frechet_distance(other[2] if label == OTHER_SEEDS else other[1], features)
        entries.append(entry)
    return entries


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
        "fd_ratio_hi": entry.get("fd_ratio_hi"), "fd_ar": entry.get("fd_ar"), "nll": entry.get("nll_mean"),
        "d_nll": entry.get("d_nll"), "d_nll_lo": entry.get("d_nll_lo"), "d_nll_hi": entry.get("d_nll_hi"),
    }  # fmt: skip


# ---- files ----------------------------------------------------------------------------------------------


def write_csv(path: Path, rows: list[dict]) -> None:
    """Rows with possibly different keys (phase timings differ between methods): the union as columns."""
    columns = list(dict.fromkeys(key for row in rows for key in row))
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)


def plot_speed_quality(summary: list[dict], path: Path, quality: str | None = None) -> Path:
    """Speedup (x) against quality (y: the column `quality`; by default the SceneEval score, else the target
    NLL), one curve per family."""
    from matplotlib.figure import Figure  # the object API: no pyplot state, no display backend

    if quality is None:
        quality = "sceneeval" if all("sceneeval" in e for e in summary) else "nll_mean"
        if not all(quality in e for e in summary):
            quality = "step_ratio_median"  # no quality measured (quality=False): steps against time instead
    names = {
        "sceneeval": "SceneEval score (higher is better)",
        "nll_mean": "target NLL of the tokens (lower is better)",
        "step_ratio_median": "sequential-step ratio over AR",
        "clip_score": "CLIP score (higher is better)",
        "fid": "FID (lower is better)",
    }
    figure = Figure(figsize=(6.5, 4.5))
    axes = figure.add_subplot()
    for family in dict.fromkeys(e["family"] for e in summary):
        points = sorted(
            (e["speedup_median"], e[quality], e["label"]) for e in summary if e["family"] == family
        )
        axes.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=family)
        for x, y, label in points if len(points) > 1 else []:  # a sweep: name each point's setting
            text = label[len(family) :].strip()
            axes.annotate(text, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
    axes.axvline(1.0, color="grey", linewidth=0.6)
    axes.set_xlabel("speedup over AR (median of per-prompt ratios)")
    axes.set_ylabel(names[quality])
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    return path


def plot_grid(
    images: list[list[torch.Tensor]], row_labels: list[str], col_labels: list[str], path: Path
) -> Path:
    """An image grid: images[row][col] [3, H, W] in [-1, 1], rows and columns labelled."""
    from matplotlib.figure import Figure

    rows, cols = len(images), len(images[0])
    figure = Figure(figsize=(1.6 * cols + 1.4, 1.6 * rows + 0.8))
    axes = figure.subplots(rows, cols, squeeze=False)
    for r in range(rows):
        for c in range(cols):
            ax = axes[r][c]
            ax.imshow(((images[r][c].float().cpu() + 1) / 2).clamp(0, 1).permute(1, 2, 0).numpy())
            ax.set_xticks([])
            ax.set_yticks([])
            if c == 0:
                ax.set_ylabel(textwrap.fill(row_labels[r], 18), fontsize=7)
            if r == 0:
                ax.set_title(textwrap.fill(col_labels[c], 24), fontsize=6)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    return path
