"""`mulo-eval`: run a speed/quality sweep (mulo_sd.evaluate) on a model set (conf/models/). A thin Hydra
`main()` around a plain `run(cfg)` that tests call directly.

    mulo-eval eval=speed_zipar            # AR vs ZipAR W=2,4,8: steps, median wall time, per-prompt ratios
    mulo-eval eval=paper_table            # every method's knob sweep + the matched-quality table
    mulo-eval eval=smoke logger=wandb     # also log the tables, plot and grid to W&B (offline by default)
    mulo-eval eval=coco5k prompts.file=... # real prompts, FID and CLIP score (docs/real_evaluation.md)
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import hydra
import torch
from mulo_sd.training.config import CONFIG_DIR
from mulo_sd.training.evaluate_prompts import run_prompt_file
from omegaconf import DictConfig, OmegaConf

from mulo_sd.decode import required_models
from mulo_sd.evaluate import (
    MATCHED_COLUMNS,
    Evaluation,
    evaluate,
    expand_runs,
    markdown_table,
    matched_quality_table,
)
from mulo_sd.model_set import ModelSet, load_model_set, train_command
from mulo_sd.prompts import evaluation_prompts
from mulo_sd.sampling import SamplerConfig
from mulo_sd.testbed import image_size

log = logging.getLogger(__name__)


@dataclass
class EvalRun:
    evaluation: Evaluation
    matched: list[dict] | None  # the matched-quality table, when configured and SceneEval scores exist


def run(cfg: DictConfig) -> EvalRun | None:
    """Evaluate the configured runs; write the files into `cfg.out_dir` (plus matched.md); log to W&B when
    `cfg.logger` has a `wandb` entry. With `prompts.file` the prompts come from that file
    (training/evaluate_prompts.py); in a multi-process run only rank 0 returns the result, the others None."""
    if cfg.get("threads"):
        torch.set_num_threads(cfg.threads)
    runs = expand_runs(OmegaConf.to_container(cfg.runs, resolve=True))
    if cfg.prompts.get("file"):
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
    prompts = evaluation_prompts(cfg.prompts.count, seed=cfg.prompts.seed, image_size=image_size(models))
    sampler = SamplerConfig(**OmegaConf.to_container(cfg.sampler, resolve=True))
    out_dir = Path(cfg.out_dir)
    evaluation = evaluate(
        models, runs, prompts, list(cfg.seeds), sampler, cfg.device, out_dir,
        warmup=cfg.warmup, quality=cfg.quality, grid_prompts=cfg.grid_prompts,
        progress=cfg.progress,
    )  # fmt: skip
    print(evaluation.files["summary_md"].read_text())
    matched = None
    if cfg.get("matched"):
        if models.sceneeval is None or not cfg.quality:
            log.warning("matched-quality table skipped: it needs SceneEval scores")
        else:
            extra = sorted(set(cfg.matched) - {"reference", "tolerance"})
            if extra:
                raise ValueError(
                    f"matched.{extra[0]} applies to prompt files (prompts.file); on SynthScenes prompts the "
                    "matched table compares SceneEval over all prompts ({reference, tolerance})"
                )
            matched = matched_quality_table(evaluation.summary, **cfg.matched)
            table = markdown_table(matched, MATCHED_COLUMNS)
            evaluation.files["matched"] = out_dir / "matched.md"
            reference, tolerance = cfg.matched.reference, cfg.matched.tolerance
            note = f"Matched quality: per method the fastest run within {tolerance} SceneEval of {reference}."
            evaluation.files["matched"].write_text(f"{note}\n\n{table}\n")
            print(f"{note}\n{table}")
    if cfg.get("logger") and "wandb" in cfg.logger:
        log_to_wandb(cfg, evaluation, matched)
    return EvalRun(evaluation, matched)


def log_to_wandb(cfg: DictConfig, evaluation: Evaluation, matched: list[dict] | None) -> None:
    """Log the summary (and matched) tables, the speed-quality plot and the image grid as one W&B step.
    Uses conf/logger/wandb.yaml's fields (project, name, save_dir, offline, id, resume)."""
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
    if "grid" in evaluation.files:
        data["grid"] = wandb.Image(str(evaluation.files["grid"]))
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
