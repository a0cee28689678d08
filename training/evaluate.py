"""`mulo-eval`: run a speed/quality sweep (mulo_sd.evaluation.harness) on a model set (conf/models/). A thin
Hydra
`main()` around a plain `run(cfg)` that tests call directly.

    mulo-eval eval=speed_zipar            # AR vs ZipAR W=2,4,8: steps, median wall time, per-prompt ratios
    mulo-eval eval=readme threads=1       # every method at its default knobs: the README's table
    mulo-eval eval=paper_table            # every method's knob sweep + the matched-quality table
    mulo-eval eval=ablations              # the paper's four MuLo-SD ablations + the accept rule (test split)
    mulo-eval eval=headline               # AR, ZipAR, MuLo-SD 2x and 4x side by side (docs/results.md)
    mulo-eval eval=smoke logger=wandb     # also log the tables, plot and grid to W&B (offline by default)
    mulo-eval eval=coco5k prompts.file=... # real prompts, FID, HPSv2, CLIP score (docs/real_evaluation.md)
    mulo-eval eval=dpg_bench prompts.file=... # DPG-Bench's prompts, its scorer's 2x2 grids
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import hydra
import torch
from mulo_sd.training.config import CONFIG_DIR
from mulo_sd.training.eval_launch import checked_launch
from mulo_sd.training.evaluate_prompts import run_prompt_file
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import InterpolationResolutionError

from mulo_sd.decoding.sampling import SamplerConfig
from mulo_sd.evaluation.harness import Evaluation, evaluate
from mulo_sd.evaluation.matched_quality import MATCHED_COLUMNS, matched_quality_table
from mulo_sd.evaluation.paired import Bootstrap
from mulo_sd.evaluation.runs import expand_runs
from mulo_sd.evaluation.tables import INTERVAL_NOTE, markdown_table, with_intervals
from mulo_sd.pipeline.decode_entry import required_models
from mulo_sd.pipeline.folder_hints import train_command
from mulo_sd.pipeline.model_set import ModelSet, load_model_set
from mulo_sd.pipeline.testbed_models import image_size
from mulo_sd.testbed.prompts import evaluation_prompts

log = logging.getLogger(__name__)


@dataclass
class EvalRun:
    evaluation: Evaluation
    matched: list[dict] | None  # the matched-quality table, when configured and SceneEval scores exist


@checked_launch  # the seeds checked and out_dir locked before anything loads
def run(cfg: DictConfig) -> EvalRun | None:
    """Evaluate the configured runs; write the files into `cfg.out_dir` (plus matched.md); log to W&B when
    `cfg.logger` has a `wandb` entry. With `prompts.file` the prompts come from that file
    (training/evaluate_prompts.py); in a multi-process run only rank 0 returns the result, the others None."""
    if cfg.get("threads"):
        torch.set_num_threads(cfg.threads)
    if cfg.get("throughput"):  # eval=throughput: images per second at each batch size, no quality tables
        from mulo_sd.training.evaluate_throughput import run_throughput

        return run_throughput(cfg)
    runs = expand_runs(run_entries(cfg))
    if cfg.prompts.get("file"):
        check_prompt_file_settings(cfg, runs)
        result = run_prompt_file(cfg, runs)
        if result is None:
            return None  # a rank other than 0 of a multi-process run: it only generated its share
        evaluation, matched = result
        if cfg.get("logger") and "wandb" in cfg.logger:
            log_to_wandb(cfg, evaluation, matched)
        return EvalRun(evaluation, matched)
    model_set = ModelSet.from_config(OmegaConf.to_container(cfg.models, resolve=True))
    names = list(dict.fromkeys(name for r in runs for name in required_models(r.method, r.knobs)))
    if cfg.quality:
        if "sceneeval" in model_set.available():
            names.append("sceneeval")
        else:
            how = f" ({train_command('sceneeval', model_set.root)})" if model_set.family == "testbed" else ""
            log.warning("no SceneEval in set '%s': quality is the target NLL only%s", model_set.name, how)
    models = load_model_set(model_set, names, cfg.device)
    matched_cfg = OmegaConf.to_container(cfg.matched, resolve=True) if cfg.get("matched") else None
    prompts = synthscenes_prompts(cfg, matched_cfg, image_size(models))
    fd_ar_seeds = fd_ar_seeds_of(cfg, models.sceneeval is not None)
    sampler = SamplerConfig(**OmegaConf.to_container(cfg.sampler, resolve=True))
    bootstrap = Bootstrap(**OmegaConf.to_container(cfg.get("bootstrap") or {}, resolve=True))
    out_dir = Path(cfg.out_dir)
    evaluation = evaluate(
        models, runs, prompts, list(cfg.seeds), sampler, cfg.device, out_dir,
        warmup=cfg.warmup, quality=cfg.quality, grid_prompts=cfg.grid_prompts,
        progress=cfg.progress, fd_ar_seeds=fd_ar_seeds, bootstrap=bootstrap, fd_min_images=cfg.fd_min_images,
        compile_every_width=cfg.compile_every_width,
    )  # fmt: skip
    print(evaluation.files["summary_md"].read_text())
    matched = None
    if matched_cfg:
        if models.sceneeval is None or not cfg.quality:
            log.warning("matched-quality table skipped: it needs SceneEval scores")
        else:
            matched = write_matched(evaluation, matched_cfg, out_dir)
    if cfg.get("logger") and "wandb" in cfg.logger:
        log_to_wandb(cfg, evaluation, matched)
    return EvalRun(evaluation, matched)


def run_entries(cfg: DictConfig) -> list[dict]:
    """The run entries, resolved one by one: a failing interpolation (e.g. a `${testbed:...}` folder not
    committed yet) names its entry."""
    entries = []
    for n, entry in enumerate(cfg.runs):
        try:
            entries.append(OmegaConf.to_container(entry, resolve=True))
        except InterpolationResolutionError as error:
            name = OmegaConf.to_container(entry).get("label") or OmegaConf.to_container(entry).get("family")
            raise ValueError(f"run entry runs[{n}] ('{name}'): {error}") from None
    return entries


def check_prompt_file_settings(cfg: DictConfig, runs: list) -> None:
    """Refuse the SynthScenes-only settings with a prompt file, where they would be ignored."""
    if cfg.prompts.get("split", "all") != "all":
        raise ValueError(
            f"prompts.split={cfg.prompts.split} splits SynthScenes prompts; with a prompt file the dev/test "
            "split is matched.dev_prompts"
        )
    if (cfg.get("matched") or {}).get("rule", "tolerance") != "tolerance":
        raise ValueError("matched.rule=interval needs per-prompt paired scores: SynthScenes prompts only")
    if (cfg.get("fd_ar") or {}).get("seeds"):
        raise ValueError("fd_ar.seeds applies to SynthScenes prompts (SceneEval features) only")
    for run in runs:
        if run.folders or run.ablations:
            raise ValueError(f"run '{run.label}': folders and ablation apply to SynthScenes prompts only")


def synthscenes_prompts(cfg: DictConfig, matched: dict | None, size: int) -> list:
    """`prompts.count` prompts of `prompts.split`, after `matched.dev_prompts` dev prompts when given (the
    matched table picks on those and reports on the test prompts)."""
    split = cfg.prompts.get("split", "all")
    prompts = evaluation_prompts(cfg.prompts.count, seed=cfg.prompts.seed, image_size=size, split=split)
    if matched is None:
        return prompts
    extra = sorted(set(matched) - {"reference", "tolerance", "rule", "dev_prompts"})
    if extra:
        raise ValueError(
            f"matched.{extra[0]} applies to prompt files (prompts.file); on SynthScenes prompts the matched "
            "table takes reference, rule, tolerance and dev_prompts"
        )
    if not matched.get("dev_prompts"):
        return prompts
    if split != "test":
        raise ValueError(
            f"matched.dev_prompts picks each setting on dev prompts and reports it on test prompts: set "
            f"prompts.split=test (got {split})"
        )
    return evaluation_prompts(matched["dev_prompts"], image_size=size, split="dev") + prompts


def fd_ar_seeds_of(cfg: DictConfig, has_sceneeval: bool) -> list[int]:
    """`fd_ar.seeds`, checked: disjoint from `seeds`, and only with quality (skipped, with a warning,
    without SceneEval)."""
    seeds = list((cfg.get("fd_ar") or {}).get("seeds") or [])
    if not seeds:
        return []
    shared = sorted(set(seeds) & set(cfg.seeds))
    if shared:
        raise ValueError(
            f"fd_ar.seeds {seeds} share {shared} with seeds {list(cfg.seeds)}: FD to AR compares with AR "
            "under other seeds"
        )
    if not cfg.quality:
        raise ValueError("fd_ar.seeds needs quality=true (FD-to-AR is FD on SceneEval features)")
    if not has_sceneeval:
        log.warning("fd_ar skipped: it needs the sceneeval model")
        return []
    return seeds


def write_matched(evaluation: Evaluation, matched: dict, out_dir: Path) -> list[dict]:
    """The matched-quality table (mulo_sd.evaluation.matched_quality_table) into matched.md, also
    printed."""
    rule, reference = matched.get("rule", "interval"), matched.get("reference", "ar")
    table = matched_quality_table(
        evaluation.summary, reference, rule=rule, tolerance=matched.get("tolerance")
    )
    match = (
        f"whose SceneEval difference to {reference} has a 95% interval containing 0"
        if rule == "interval"
        else f"whose SceneEval lies within {matched['tolerance']} of {reference}'s"
    )
    where = (
        f"chosen on the {matched['dev_prompts']} dev prompts, reported on the test prompts"
        if matched.get("dev_prompts")
        else "chosen on the same prompts it is reported on (no dev split: matched.dev_prompts)"
    )
    note = f"Matched quality: per method the fastest run {match}; {where}. {INTERVAL_NOTE}."
    text = markdown_table(with_intervals(table), MATCHED_COLUMNS)
    evaluation.files["matched"] = out_dir / "matched.md"
    evaluation.files["matched"].write_text(f"{note}\n\n{text}\n")
    print(f"{note}\n{text}")
    return table


def log_to_wandb(cfg: DictConfig, evaluation: Evaluation, matched: list[dict] | None) -> None:
    """Log the summary (and matched) tables, the speed-quality plot, the image grid and the ablation plot as
    one W&B step. Uses conf/logger/wandb.yaml's fields (project, name, save_dir, offline, id, resume)."""
    import wandb

    settings = cfg.logger.wandb
    save_dir = Path(settings.save_dir)
    save_dir.mkdir(parents=True, exist_ok=True)
    run = wandb.init(
        project=settings.project, name=settings.name, dir=str(save_dir), id=settings.get("id"),
        resume=settings.get("resume"), mode="offline" if settings.get("offline", True) else "online",
        config=OmegaConf.to_container(cfg, resolve=True),
    )  # fmt: skip
    data = {
        "summary": _table(wandb, evaluation.summary),
        "speed_quality": wandb.Image(str(evaluation.files["speed_quality"])),
    }
    for name in ("grid", "ablations"):
        if name in evaluation.files:
            data[name] = wandb.Image(str(evaluation.files[name]))
    if matched:
        data["matched_quality"] = _table(wandb, matched)
    run.log(data)
    run.finish()


def _table(wandb, rows: list[dict]):
    columns = list(dict.fromkeys(key for row in rows for key in row))
    data = [[row.get(column) for column in columns] for row in rows]
    return wandb.Table(columns=columns, data=data, allow_mixed_types=True)


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="evaluate")
def main(cfg: DictConfig) -> None:
    result = run(cfg)
    if result is None:
        return
    for name, path in result.evaluation.files.items():
        print(f"{name:>14s}  {path}")


if __name__ == "__main__":
    main()
