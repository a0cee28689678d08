"""`mulo-eval` on a prompt file (`prompts.file=...`, docs/real_evaluation.md): sharded, resumable generation
on every rank (`torchrun --nproc_per_node=N -m mulo_sd.training.evaluate ...`), then on rank 0 the metrics
over the gathered images, the batch-1 speed pass, the summary and the matched-quality table. The inputs are
checked on every rank first (training/eval_inputs.py), the seeds and the out_dir lock before that
(training/eval_launch.py).
"""

from __future__ import annotations

import logging
from pathlib import Path

from mulo_sd.training.eval_inputs import on_every_rank, prepared_inputs
from omegaconf import DictConfig, OmegaConf

from mulo_sd.decoding.sampling import SamplerConfig
from mulo_sd.evaluation.generation import gather_records, generate
from mulo_sd.evaluation.harness import Evaluation
from mulo_sd.evaluation.metrics.fid import reference_statistics
from mulo_sd.evaluation.metrics.images import load_image
from mulo_sd.evaluation.ranks import barrier, broadcast, close_ranks, init_ranks
from mulo_sd.evaluation.real_evaluate import matched_split_table, score_prompt_set
from mulo_sd.evaluation.tables import markdown_table
from mulo_sd.pipeline.decode_entry import required_models
from mulo_sd.pipeline.model_set import ModelSet, load_model_set

log = logging.getLogger(__name__)


def run_prompt_file(cfg: DictConfig, runs: list) -> tuple[Evaluation, list[dict] | None] | None:
    """Generate on every rank, score on rank 0: (evaluation, matched table or None) there, None elsewhere.
    Every rank checks the inputs before any model loads, and a failure on any stops them all before any
    decode (training/eval_inputs.py)."""
    rank, world_size, device = init_ranks(cfg.device)
    try:
        # every rank writes into rank 0's folder (each rank's Hydra run folder has its own time and pid)
        out_dir = Path(broadcast(str(cfg.out_dir)))
        prompt_set, setup = on_every_rank(lambda: prepared_inputs(cfg, rank, device))
        if prompt_set.skipped and rank == 0:
            log.warning("skipped %d %s in %s", prompt_set.skipped, prompt_set.skip_reason, prompt_set.source)
        model_set = ModelSet.from_config(OmegaConf.to_container(cfg.models, resolve=True))
        names = list(dict.fromkeys(name for r in runs for name in required_models(r.method, r.knobs)))
        models = load_model_set(model_set, names, device)
        seeds = list(cfg.seeds)
        sampler = SamplerConfig(**OmegaConf.to_container(cfg.sampler, resolve=True))
        counts = generate(
            models, runs, prompt_set.prompts, seeds, sampler, out_dir / "images", rank, world_size,
            batch_size=cfg.generate.batch_size, warmup=cfg.warmup, progress=cfg.progress,
        )  # fmt: skip
        log.info("rank %d: %d images decoded, %d found done (%d unreadable statistics lines)", rank,
                 counts.decoded, counts.resumed, counts.bad_lines)  # fmt: skip
        barrier()
        if rank != 0:
            return None
        rows = gather_records(out_dir / "images", runs, prompt_set.prompts, seeds)
        if setup.fid_extractor is not None:
            size = setup.fid_resolution or load_image(rows[0]["path"]).shape[-1]
            setup.fid_reference = reference_statistics(
                setup.fid_extractor, cfg.fid.reference, size, cfg.metric_batch_size, device,
                cache=out_dir / "fid_reference.npz", protocol=setup.fid_protocol,
            )  # fmt: skip
        matched_cfg = cfg.get("matched") or {}
        evaluation = score_prompt_set(
            models, runs, prompt_set, rows, seeds, sampler, device, out_dir, setup,
            dev_count=matched_cfg.get("dev_prompts"), split_seed=matched_cfg.get("split_seed", 0),
            speed_prompts=cfg.speed.prompts, warmup=cfg.warmup, grid_prompts=cfg.grid_prompts,
            world_size=world_size, progress=cfg.progress,
        )  # fmt: skip
        print(evaluation.files["summary_md"].read_text())
        return evaluation, matched_table(cfg, evaluation, out_dir)
    finally:
        close_ranks()


def matched_table(cfg: DictConfig, evaluation: Evaluation, out_dir: Path) -> list[dict] | None:
    """matched.md from the summary, when `matched` is configured and the metric and speed pass exist."""
    matched = cfg.get("matched")
    if not matched:
        return None
    metric = matched.get("metric", "clip_score")
    if cfg.speed.prompts <= 0 or not all(entry.get(metric) is not None for entry in evaluation.summary):
        log.warning("matched-quality table skipped: it needs the speed pass and '%s' for every run", metric)
        return None
    table = matched_split_table(evaluation.summary, metric, matched.tolerance, matched.reference)
    picked = "dev" if any(entry["split"] == "dev" for entry in evaluation.summary) else "all"
    reported = "the disjoint test prompts" if picked == "dev" else "the same prompts (no dev/test split)"
    note = (
        f"Matched quality: per method the fastest run whose {metric} on the {picked} prompts lies within "
        f"{matched.tolerance} of {matched.reference}'s; its numbers are from {reported}."
    )
    evaluation.files["matched"] = out_dir / "matched.md"
    evaluation.files["matched"].write_text(f"{note}\n\n{markdown_table(table, tuple(table[0]))}\n")
    print(f"{note}\n{markdown_table(table, tuple(table[0]))}")
    return table
