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
  prompts, in SceneEval feature space.

Writes into out_dir: runs.csv (one row per run, prompt, seed), summary.csv and summary.md (one row per run;
with SceneEval also references.csv, the same quality columns for the real images and their round trips),
speed_quality.png (speedup against quality, one curve per family over its knob sweep) and
grid_seed<seed>.png (rows: real image, then one per run; columns: the first prompts).
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

import torch
import torch.nn.functional as F
from tqdm import tqdm

from mulo_sd.decode import decode, resolve_knobs
from mulo_sd.model_set import Models
from mulo_sd.prompts import Prompt
from mulo_sd.sampling import SamplerConfig
from mulo_sd.sceneeval import (
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
    "sceneeval_sem", *(f"sceneeval_{kind}" for kind in CHECK_KINDS), "fd",
)  # fmt: skip
REFERENCE_COLUMNS = (
    "label", "images", "sceneeval", "sceneeval_sem", *(f"sceneeval_{kind}" for kind in CHECK_KINDS), "fd",
)  # fmt: skip
MATCHED_COLUMNS = (
    "method",
    "setting",
    "speedup",
    "speedup_of_medians",
    "step_ratio",
    "sceneeval",
    "fd",
    "nll",
)


@dataclass
class RunSpec:
    """One operating point: `method` with `knobs`. `family` groups a knob sweep into one curve / table row
    (default: the method); `label` names the run uniquely (default: family and knobs)."""

    method: str
    knobs: dict = field(default_factory=dict)
    family: str = ""
    label: str = ""

    def __post_init__(self):
        resolve_knobs(self.method, self.knobs)  # a bad method or knob fails before anything is decoded
        self.family = self.family or self.method
        self.label = self.label or " ".join([self.family, *(f"{k}={v}" for k, v in self.knobs.items())])


def expand_runs(entries: list[dict]) -> list[RunSpec]:
    """Run specs from config entries `{method, family?, knobs?, sweep?: {knob: [values]}}`; a sweep (one
    knob) gives one run per value, labelled '<family> <knob>=<value>'."""
    runs = []
    for entry in entries:
        unknown = sorted(set(entry) - {"method", "family", "knobs", "sweep"})
        if unknown or "method" not in entry:
            raise ValueError(
                f"a run entry has keys method, family, knobs, sweep (method required), got {entry}"
            )
        knobs, family = dict(entry.get("knobs") or {}), entry.get("family") or entry["method"]
        sweep = dict(entry.get("sweep") or {})
        if len(sweep) > 1:
            raise ValueError(f"a run entry sweeps one knob, got {sorted(sweep)} for family '{family}'")
        if not sweep:
            runs.append(RunSpec(entry["method"], knobs, family))
            continue
        ((name, values),) = sweep.items()
        for value in values:
            runs.append(RunSpec(entry["method"], {**knobs, name: value}, family, f"{family} {name}={value}"))
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
) -> Evaluation:
    """Run the protocol of the module docstring and write its files. SceneEval scores and FD are computed
    when `quality` and `models.sceneeval` is loaded; the NLL whenever `quality`. `progress` shows a bar of the
    decodes done (stderr) with the run being decoded."""
    reference = reference_run(runs)
    if not prompts or not seeds:
        raise ValueError(f"need at least one prompt and one seed, got {len(prompts)} and {len(seeds)}")
    target, wanted = models.require("target"), torch.device(device)
    if target.device.type != wanted.type or wanted.index not in (None, target.device.index):
        raise ValueError(f"the models are on {target.device}, not on the evaluation device {device}")
    scorer = models.sceneeval if quality else None
    for run in runs:
        for _ in range(warmup):
            decode(run.method, models, [prompts[0].caption], run.knobs, sampler, seeds[0])
    rows, features, grid = [], {run.label: [] for run in runs}, {}
    bar = tqdm(
        total=len(prompts) * len(seeds) * len(runs), unit="decode", disable=not progress, file=sys.stderr
    )
    for i, prompt in enumerate(prompts):
        cond, cond_mask = models.condition([prompt.caption])
        for seed in seeds:
            for run in runs[i % len(runs) :] + runs[: i % len(runs)]:
                bar.set_postfix_str(f"prompt {i + 1}/{len(prompts)}, seed {seed}: {run.label}", refresh=False)
                result = decode(run.method, models, [prompt.caption], run.knobs, sampler, seed)
                row = {
                    "family": run.family, "label": run.label, "method": run.method,
                    "knobs": json.dumps(run.knobs, sort_keys=True), "prompt_index": prompt.index,
                    "prompt": prompt.caption, "seed": seed, "device": str(device), **result.stats.as_dict(),
                }  # fmt: skip
                if quality:
                    row["nll"] = float(token_nll(target, result.tokens, cond, cond_mask)[0])
                if scorer is not None:
                    row |= sceneeval_rows(scorer, result.image, [prompt.caption])[0]
                    features[run.label].append(scene_features(scorer, result.image))
                if i < grid_prompts and seed == seeds[0]:
                    grid[run.label, i] = result.image[0].cpu()
                rows.append(row)
                bar.update()
    bar.close()
    order = {run.label: n for n, run in enumerate(runs)}
    rows.sort(key=lambda row: order[row["label"]])  # stable: prompts and seeds stay in decoding order
    add_ratios(rows, reference.label)
    summary = summarize(rows, reference.label)
    references = []
    if scorer is not None:
        real = scene_features(scorer, torch.stack([p.image for p in prompts]))
        for entry in summary:
            entry["fd"] = frechet_distance(real, torch.cat(features[entry["label"]]))
        references = reference_quality(scorer, models.require("vq"), prompts, real)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {
        "runs": out_dir / "runs.csv",
        "summary": out_dir / "summary.csv",
        "summary_md": out_dir / "summary.md",
    }
    write_csv(files["runs"], rows)
    write_csv(files["summary"], summary)
    reference_md = ""
    if references:
        files["references"] = out_dir / "references.csv"
        write_csv(files["references"], references)
        reference_md = (
            "\n## References\n\nThe held-out images of the same prompts and their tokenizer round trips "
            f"(FD to the real images):\n\n{markdown_table(references, REFERENCE_COLUMNS)}\n"
        )
    header = (
        f"{len(prompts)} prompts x {len(seeds)} seed(s), batch 1, device {device}, warm-up {warmup}; "
        f"sampler {sampler}; speedups against '{reference.label}'."
    )
    files["summary_md"].write_text(
        f"# Evaluation\n\n{header}\n\n{markdown_table(summary, SUMMARY_COLUMNS)}\n{reference_md}"
    )
    files["speed_quality"] = plot_speed_quality(summary, out_dir / "speed_quality.png")
    columns = prompts[:grid_prompts]
    if columns:
        images = [[p.image for p in columns]]
        images += [[grid[run.label, i] for i in range(len(columns))] for run in runs]
        labels = ["real (held-out)"] + [run.label for run in runs]
        captions = [f"#{p.index}: {p.caption}" for p in columns]
        files["grid"] = plot_grid(images, labels, captions, out_dir / f"grid_seed{seeds[0]}.png")
    return Evaluation(rows, summary, files, references)


def add_ratios(rows: list[dict], reference: str) -> None:
    """Add speedup, step_ratio and nfe_ratio to every row: the reference run's (label `reference`) wall time,
    sequential steps and target forwards for the same prompt and seed over the row's own."""
    base = {(row["prompt_index"], row["seed"]): row for row in rows if row["label"] == reference}
    for row in rows:
        key = (row["prompt_index"], row["seed"])
        if key not in base:
            raise ValueError(
                f"no '{reference}' row for prompt {key[0]}, seed {key[1]}: cannot form its ratios"
            )
        ref = base[key]
        row["speedup"] = ref["wall_s"] / row["wall_s"]
        row["step_ratio"] = ref["sequential_steps"] / row["sequential_steps"]
        row["nfe_ratio"] = ref["target_forwards"] / row["target_forwards"]


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def summarize(rows: list[dict], reference: str) -> list[dict]:
    """One entry per run label (in order of first appearance) from rows carrying `add_ratios`' columns."""
    labels = list(dict.fromkeys(row["label"] for row in rows))
    reference_wall = statistics.median(row["wall_s"] for row in rows if row["label"] == reference)
    summary = []
    for label in labels:
        runs = [row for row in rows if row["label"] == label]
        first = runs[0]
        wall_median = statistics.median(row["wall_s"] for row in runs)
        drafted = sum(row["tokens_drafted"] for row in runs)
        entry = {
            "family": first["family"], "label": label, "method": first["method"], "knobs": first["knobs"],
            "images": len(runs), "wall_s_median": wall_median,
            "speedup_median": statistics.median(row["speedup"] for row in runs),
            "speedup_of_medians": reference_wall / wall_median,
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
def reference_quality(scorer, tokenizer, prompts: list[Prompt], real_features: torch.Tensor) -> list[dict]:
    """SceneEval of the prompts' real held-out images and of their tokenizer round trips (encode, decode):
    what a perfect target would score, and the most any method can score through this tokenizer.
    real_features: `scene_features` of the real images, which the runs' FD already needed."""
    real = torch.stack([p.image for p in prompts]).to(next(tokenizer.parameters()).device)
    round_trip = tokenizer.decode(tokenizer.encode(real)).clamp(-1, 1)
    captions = [p.caption for p in prompts]
    entries = []
    references = (
        ("real images", real, real_features),
        ("tokenizer round trip", round_trip, scene_features(scorer, round_trip)),
    )
    for label, images, features in references:
        quality = sceneeval_summary(sceneeval_rows(scorer, images, captions))
        fd = frechet_distance(real_features, features)
        entries.append({"label": label, "images": len(prompts), **quality, "fd": fd})
    return entries


def matched_quality_table(
    summary: list[dict], reference: str = REFERENCE_METHOD, *, tolerance: float
) -> list[dict]:
    """The paper's matched-quality protocol: the reference row (method or label `reference`), then for every
    other family the fastest run (highest median per-prompt speedup) whose SceneEval score matches the
    reference's, i.e. lies within `tolerance` of it on either side. A family with no such run gets setting
    None and no numbers.

    Two-sided because every method samples from the same target: a score far above the target's own is a
    drift away from its distribution (ZipAR with a small window smears colour, which the colour and object
    checks reward), not a quality the method adds, and would let such a run stand in for the target."""
    if not all("sceneeval" in entry for entry in summary):
        raise ValueError(
            "matched quality needs SceneEval scores in the summary (evaluate with the sceneeval model)"
        )
    return [_matched_row(family, entry) for family, entry in matched_runs(summary, reference, tolerance)]


def matched_runs(
    summary: list[dict], reference: str = REFERENCE_METHOD, tolerance: float = 0.0, metric: str = "sceneeval"
) -> list[tuple[str, dict | None]]:
    """(family, chosen summary entry or None) per family, the reference family first: the selection of
    `matched_quality_table`, on any quality column `metric` of the summary."""
    if tolerance < 0:
        raise ValueError(f"tolerance must be >= 0 ({metric} points), got {tolerance}")
    missing = [entry["label"] for entry in summary if entry.get(metric) is None]
    if missing:
        raise ValueError(f"matched quality needs '{metric}' in every summary row; missing for {missing}")
    matches = [entry for entry in summary if reference in (entry["method"], entry["label"])]
    if len(matches) != 1:
        raise ValueError(f"reference '{reference}' must name exactly one summary row, got {len(matches)}")
    base = matches[0]
    families = list(dict.fromkeys(entry["family"] for entry in summary if entry["family"] != base["family"]))
    chosen = [(base["family"], base)]
    for family in families:
        within = [
            entry for entry in summary
            if entry["family"] == family and abs(entry[metric] - base[metric]) <= tolerance
        ]  # fmt: skip
        chosen.append((family, max(within, key=lambda entry: entry["speedup_median"], default=None)))
    return chosen


def _matched_row(family: str, entry: dict | None) -> dict:
    if entry is None:
        return {"method": family, **dict.fromkeys(MATCHED_COLUMNS[1:])}
    setting = entry["label"][len(family) :].strip() if entry["label"].startswith(family) else entry["label"]
    return {
        "method": family, "setting": setting or "-", "speedup": entry["speedup_median"],
        "speedup_of_medians": entry["speedup_of_medians"], "step_ratio": entry["step_ratio_median"],
        "sceneeval": entry["sceneeval"], "fd": entry.get("fd"), "nll": entry.get("nll_mean"),
    }  # fmt: skip


# ---- files ----------------------------------------------------------------------------------------------


def write_csv(path: Path, rows: list[dict]) -> None:
    """Rows with possibly different keys (phase timings differ between methods): the union as columns."""
    columns = list(dict.fromkeys(key for row in rows for key in row))
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def markdown_table(rows: list[dict], columns: tuple[str, ...]) -> str:
    """A markdown table of `columns` (those present in the rows)."""
    columns = [c for c in columns if any(c in row for row in rows)]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(row.get(c)) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


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
