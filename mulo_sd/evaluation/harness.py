"""The speed/quality harness (docs/evaluation.md): every run (a method with its knobs,
mulo_sd/evaluation/runs.py) decodes every prompt with the same fixed seeds, side by side in one process,
batch 1.

Protocol:
- warm-up: each run decodes the first prompt `warmup` times first (allocations, kernels; results dropped);
  its seconds are the summary's `warmup_s`, for a compiled run (RunSpec.compile) its compilation;
- interleaving: for each prompt and seed, every run decodes once before the next prompt starts, in an order
  rotated by one per prompt, so machine noise (other jobs, clock changes) hits all runs alike;
- speed: `wall_s` is the decode's token-generation time (DecodeStats.wall_seconds; the image decode is left
  out, it is the same for every method). Per (prompt, seed), speedup = AR wall / run wall (and with a
  compiled AR run, speedup_compiled_ar = its wall / run wall), step_ratio = AR
  sequential steps / run sequential steps, nfe_ratio = AR target forwards / run target forwards. A run's
  summary gives the median of its per-prompt ratios and, for speed, also the ratio of the medians
  (mulo_sd/evaluation/summaries.py);
- quality (`quality=True`, mulo_sd/evaluation/quality.py): `nll` = the target's mean negative log-likelihood
  of the produced tokens (one teacher-forced forward with the prompt's caption, conditional, no guidance: how
  far a method drifts from the target's own distribution; plain AR is the reference); with SceneEval loaded,
  `sceneeval` = the fraction of the prompt's checks the image passes (mean over prompts in the summary),
  `sceneeval_<kind>` the same for one kind of check (object, count, colour, relation: GenEval's per-task
  scores, mean over the prompts that state that kind) and `fd` = Frechet distance of the run's images to the
  real held-out images of the same prompts, in SceneEval feature space; `texture` = the RMS contrast of the
  image's luma detail finer than 32 px, percent, and `pattern` = the part of it in its 32 strongest
  frequencies, the regular part (mulo_sd/evaluation/texture.py: a run's means, `<s>_ratio` to AR's and
  `<s>_gap` to the real images');
- paired with AR (mulo_sd/evaluation/paired.py): per (prompt, seed) `d_sceneeval`, `d_nll`, `d_texture`
  and `d_pattern`, the difference to AR's decode of the same prompt and seed; a run's summary gives their
  means and, like the median speedup, a bootstrap interval (`_lo`, `_hi`) over the prompts;
- FD ratio (mulo_sd/evaluation/fd_ratio.py): `fd_ratio` = a run's FD over AR's, with a bootstrap interval
  over the prompts on the reported split; the tables show no FD of a run of fewer images than FD needs
  (mulo_sd/evaluation/fd_minimum.py: "n/a (<N images)"; the CSVs keep the numbers);
- FD to AR (`fd_ar_seeds`): AR decodes every reported prompt once more per extra seed; `fd_ar` is the FD of
  a run's images to those, and AR's own `fd_ar` (AR under other seeds) the floor;
- splits: prompts carry their split (mulo_sd/testbed/prompts.py); every summary entry is one (split, run).

Writes into out_dir (mulo_sd/evaluation/writers.py): runs.csv (one row per run, prompt, seed), summary.csv
and summary.md (one row per split and run, the table against AR, one table per ablation; with SceneEval also
references.csv, the same quality columns for the real images, their round trips and AR under the other
seeds), speed_quality.png (speedup against quality, one curve per family over its knob sweep), ablations.png
(with ablation runs) and grid_seed<seed>.png (rows: real image, then one per run; columns: the first
reported prompts). mulo_sd/evaluation/matched_quality.py applies the paper's matched-quality protocol to a
summary.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from mulo_sd.decoding.sampling import SamplerConfig
from mulo_sd.evaluation.fd_minimum import MIN_FD_IMAGES, mark_fd_minimum
from mulo_sd.evaluation.paired import BOOTSTRAP, Bootstrap
from mulo_sd.evaluation.quality import OTHER_SEEDS, reference_quality, sceneeval_rows, token_nll
from mulo_sd.evaluation.runs import RunSpec, compiled_reference_run, reference_run
from mulo_sd.evaluation.summaries import add_fd_ratios, add_ratios, reported_splits, summarize
from mulo_sd.evaluation.texture import add_texture_columns, image_scores, real_textures, with_texture
from mulo_sd.evaluation.writers import write_outputs
from mulo_sd.pipeline.decode_entry import decode
from mulo_sd.pipeline.model_set import Models
from mulo_sd.pipeline.run_models import with_folders
from mulo_sd.testbed.prompts import Prompt
from mulo_sd.testbed.sceneeval import frechet_distance, scene_features


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
    fd_min_images: int = MIN_FD_IMAGES,
    compile_every_width: bool = False,
) -> Evaluation:
    """Run the protocol of the module docstring and write its files. SceneEval scores and FD are computed
    when `quality` and `models.sceneeval` is loaded; the NLL whenever `quality`. `progress` shows a bar of the
    decodes done (stderr) with the run being decoded. `fd_ar_seeds` (needs SceneEval): AR's extra seeds for
    `fd_ar`, decoded on the reported prompts (the test split when there is a dev split, else all); disjoint
    from `seeds` for the floor to mean anything (mulo-eval refuses an overlap). The tables show the FDs of
    a row with fewer than `fd_min_images` images as "n/a" (mulo_sd/evaluation/fd_minimum.py).
    `compile_every_width`: the compiled runs compile every step width in their warm-up (decode's
    compile="every_width"), so no timed decode compiles a graph."""
    reference = reference_run(runs)
    scorer = _checked_scorer(models, prompts, seeds, device, quality, fd_ar_seeds)
    run_models = {
        run.label: with_folders(models, run.folders, run.label) if run.folders else models for run in runs
    }
    splits = list(dict.fromkeys(p.split for p in prompts))
    reported = reported_splits(splits)
    shown = [p for p in prompts if p.split == reported[0]][:grid_prompts]
    sweep = Sweep(models, run_models, sampler, device, quality, scorer, shown, seeds[0], compile_every_width)
    warmup_seconds = sweep.warm_up(runs, prompts[0], seeds[0], warmup)
    fd_ar_prompts = [p for p in prompts if p.split in reported] if fd_ar_seeds else []
    decodes = sweep.decode_all(runs, reference, prompts, seeds, fd_ar_prompts, fd_ar_seeds, progress)
    rows = decodes.rows
    summary = _summarize_splits(rows, runs, splits, reference, bootstrap)
    for entry in summary:
        entry["warmup_s"] = round(warmup_seconds[entry["label"]], 3)
    if quality:
        add_texture_columns(summary, real_textures(prompts), reference.label)
    references = []
    if scorer is not None:
        references = _add_frechet_distances(summary, decodes, scorer, models, prompts, reference, bootstrap)
        mark_fd_minimum([*summary, *references], fd_min_images)
    files = write_outputs(
        Path(out_dir), rows, summary, references, runs, reference, prompts, seeds, sampler, device, warmup,
        shown, decodes.grid,
    )  # fmt: skip
    return Evaluation(rows, summary, files, references)


def _summarize_splits(
    rows: list[dict], runs: list[RunSpec], splits: list[str], reference: RunSpec, bootstrap: Bootstrap
) -> list[dict]:
    """The summary entries, split by split: the rows sorted into run order first (in place) and given their
    ratios and paired differences to the reference's decodes."""
    order = {run.label: n for n, run in enumerate(runs)}
    rows.sort(key=lambda row: order[row["label"]])  # stable: prompts and seeds stay in decoding order
    compiled = compiled_reference_run(runs)
    add_ratios(rows, reference.label, compiled.label if compiled else None)
    return [
        entry for split in splits
        for entry in summarize([row for row in rows if row["split"] == split], reference.label, bootstrap)
    ]  # fmt: skip


def _checked_scorer(
    models: Models, prompts: list[Prompt], seeds: list[int], device, quality: bool, fd_ar_seeds: list[int]
):
    """The SceneEval model that scores the decodes (None: none), once the inputs are checked."""
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
    return scorer


@dataclass
class Decodes:
    """What the decode pass collects."""

    rows: list[dict] = field(default_factory=list)  # one per (run, prompt, seed), in decoding order
    other_rows: list[dict] = field(default_factory=list)  # SceneEval + texture rows of AR, fd_ar seeds
    # (label, split) -> {(prompt index, seed): SceneEval features}
    features: dict = field(default_factory=dict)
    grid: dict = field(default_factory=dict)  # (label, grid column) -> image: the shown prompts, first seed


@dataclass
class Sweep:
    """One evaluation's decode pass: its models and settings, and the Decodes it collects."""

    models: Models
    run_models: dict[str, Models]  # run label -> its models (with the run's own folders swapped in)
    sampler: SamplerConfig
    device: str | torch.device
    quality: bool
    scorer: object | None  # the SceneEval model, None: no SceneEval scores
    shown: list[Prompt]  # the grid's prompts (its columns), their images decoded under grid_seed
    grid_seed: int
    compile_every_width: bool = False  # a compiled run's first decode compiles every step width
    decodes: Decodes = field(default_factory=Decodes)
    target: torch.nn.Module = field(init=False)  # scores the NLL of the tokens
    grid_columns: dict[tuple[str, int], int] = field(init=False)  # (split, prompt index) -> grid column

    def __post_init__(self):
        self.target = self.models.require("target")
        self.grid_columns = {(p.split, p.index): n for n, p in enumerate(self.shown)}

    def warm_up(self, runs: list[RunSpec], prompt: Prompt, seed: int, times: int) -> dict[str, float]:
        """Each run decodes `prompt` `times` times, the results dropped (allocations, kernels; a compiled
        run's graphs) -> run label -> the seconds it took."""
        seconds = {}
        for run in runs:
            start = time.perf_counter()
            for _ in range(times):
                self._decode(run, prompt, seed)
            seconds[run.label] = time.perf_counter() - start
        return seconds

    def decode_all(
        self, runs: list[RunSpec], reference: RunSpec, prompts: list[Prompt], seeds: list[int],
        fd_ar_prompts: list[Prompt], fd_ar_seeds: list[int], progress: bool,
    ) -> Decodes:  # fmt: skip
        """Every run on every prompt and seed, interleaved (module docstring), then AR under the fd_ar seeds
        on the fd_ar prompts; a progress bar (stderr) names the decode in progress."""
        fd_ar_keys = {(p.split, p.index) for p in fd_ar_prompts}
        total = len(prompts) * len(seeds) * len(runs) + len(fd_ar_prompts) * len(fd_ar_seeds)
        bar = tqdm(total=total, unit="decode", disable=not progress, file=sys.stderr)
        for i, prompt in enumerate(prompts):
            cond, cond_mask = self.models.condition([prompt.caption])
            where = f"{prompt.split} prompt {i + 1}/{len(prompts)}"
            for seed in seeds:
                for run in runs[i % len(runs) :] + runs[: i % len(runs)]:
                    bar.set_postfix_str(f"{where}, seed {seed}: {run.label}", refresh=False)
                    self._add_run_decode(run, prompt, seed, cond, cond_mask)
                    bar.update()
            for seed in fd_ar_seeds if (prompt.split, prompt.index) in fd_ar_keys else ():
                bar.set_postfix_str(f"{where}, seed {seed}: {OTHER_SEEDS}", refresh=False)
                self._add_other_seed_decode(reference, prompt, seed)
                bar.update()
        bar.close()
        return self.decodes

    def _add_run_decode(self, run: RunSpec, prompt: Prompt, seed: int, cond, cond_mask) -> None:
        """Decode `prompt` with `run` under `seed`: its row, its quality scores, SceneEval features and, for a
        shown prompt under the grid seed, its grid image. cond, cond_mask: the prompt's condition."""
        result = self._decode(run, prompt, seed)
        row = {
            "family": run.family, "label": run.label, "method": run.method,
            "knobs": json.dumps(run.knobs, sort_keys=True), "split": prompt.split,
            "prompt_index": prompt.index, "prompt": prompt.caption, "seed": seed,
            "background": prompt.attributes.get("background", {}).get("kind"),
            "device": str(self.device), **result.stats.as_dict(),
        }  # fmt: skip
        if self.quality:
            row["nll"] = float(token_nll(self.target, result.tokens, cond, cond_mask)[0])
            row |= image_scores(result.image)[0]
        if self.scorer is not None:
            row |= sceneeval_rows(self.scorer, result.image, [prompt.caption])[0]
            self._add_features(run.label, prompt, seed, result.image)
        column = self.grid_columns.get((prompt.split, prompt.index))
        if column is not None and seed == self.grid_seed:
            self.decodes.grid[run.label, column] = result.image[0].cpu()
        self.decodes.rows.append(row)

    def _add_other_seed_decode(self, reference: RunSpec, prompt: Prompt, seed: int) -> None:
        """AR's decode of `prompt` under an extra seed for fd_ar: its SceneEval and texture row, features."""
        result = self._decode(reference, prompt, seed)
        scores = sceneeval_rows(self.scorer, result.image, [prompt.caption])
        self.decodes.other_rows.append(with_texture(scores, result.image)[0])
        self._add_features(OTHER_SEEDS, prompt, seed, result.image)

    def _decode(self, run: RunSpec, prompt: Prompt, seed: int):
        models = self.run_models[run.label]
        compile = "every_width" if run.compile and self.compile_every_width else run.compile
        return decode(run.method, models, [prompt.caption], run.knobs, self.sampler, seed, compile=compile)

    def _add_features(self, label: str, prompt: Prompt, seed: int, images: torch.Tensor) -> None:
        decodes = self.decodes.features.setdefault((label, prompt.split), {})
        decodes[prompt.index, seed] = scene_features(self.scorer, images)


def _add_frechet_distances(
    summary: list[dict], decodes: Decodes, scorer, models: Models, prompts: list[Prompt], reference: RunSpec,
    bootstrap: Bootstrap,
) -> list[dict]:  # fmt: skip
    """Add every summary entry's fd, fd_ar (with fd_ar seeds) and fd_ratio; return the reference rows of the
    first reported split (quality.reference_quality)."""
    splits = list(dict.fromkeys(p.split for p in prompts))
    reported = reported_splits(splits)
    real = {
        split: scene_features(scorer, torch.stack([p.image for p in prompts if p.split == split]))
        for split in splits
    }
    pooled = {key: torch.cat(list(value.values())) for key, value in decodes.features.items()}
    for entry in summary:
        own = pooled[entry["label"], entry["split"]]
        entry["fd"] = frechet_distance(real[entry["split"]], own)
        if (OTHER_SEEDS, entry["split"]) in pooled:
            entry["fd_ar"] = frechet_distance(pooled[OTHER_SEEDS, entry["split"]], own)
    add_fd_ratios(summary, decodes.features, real, prompts, reference.label, reported, bootstrap)
    split = reported[0]
    other = None
    if decodes.other_rows:
        other = (decodes.other_rows, pooled[OTHER_SEEDS, split], pooled[reference.label, split])
    split_prompts = [p for p in prompts if p.split == split]
    return reference_quality(scorer, models.require("vq"), split_prompts, real[split], other)
