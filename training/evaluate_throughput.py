"""`mulo-eval eval=throughput` (conf/eval/throughput.yaml): every run's images per second at each batch size,
side by side in one process (mulo_sd/evaluation/throughput.py, docs/batching.md)."""

from __future__ import annotations

import sys
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from mulo_sd.decoding.sampling import SamplerConfig
from mulo_sd.evaluation.runs import expand_runs
from mulo_sd.evaluation.throughput import measure_throughput, write_throughput
from mulo_sd.pipeline.decode_entry import required_models
from mulo_sd.pipeline.model_set import ModelSet, load_model_set
from mulo_sd.pipeline.run_models import with_folders
from mulo_sd.pipeline.testbed_models import image_size
from mulo_sd.testbed.prompts import evaluation_prompts


def run_throughput(cfg: DictConfig) -> None:
    """Measure and write throughput.csv / .md / .png into cfg.out_dir; print the table."""
    settings = OmegaConf.to_container(cfg.throughput, resolve=True)
    unknown = sorted(set(settings) - {"batch_sizes", "batches"})
    if unknown:
        raise ValueError(f"throughput.{unknown[0]}: unknown setting (batch_sizes, batches)")
    runs = expand_runs([OmegaConf.to_container(entry, resolve=True) for entry in cfg.runs])
    model_set = ModelSet.from_config(OmegaConf.to_container(cfg.models, resolve=True))
    names = list(dict.fromkeys(name for r in runs for name in required_models(r.method, r.knobs)))
    models = load_model_set(model_set, names, cfg.device)
    models_of = {
        run.label: with_folders(models, run.folders, run.label) if run.folders else models for run in runs
    }
    split = cfg.prompts.get("split", "all")
    prompts = evaluation_prompts(
        cfg.prompts.count, seed=cfg.prompts.seed, image_size=image_size(models), split=split
    )
    sampler = SamplerConfig(**OmegaConf.to_container(cfg.sampler, resolve=True))
    rows = measure_throughput(
        models_of, runs, [p.caption for p in prompts], list(settings["batch_sizes"]), settings["batches"],
        sampler, models.require("target").device,
    )  # fmt: skip
    command = "mulo-eval " + " ".join(sys.argv[1:])
    files = write_throughput(rows, Path(cfg.out_dir), command.strip())
    print(files["md"].read_text())
    for name, path in files.items():
        print(f"{name:>14s}  {path}")
