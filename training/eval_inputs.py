"""The inputs of `mulo-eval` on a prompt file, checked on every rank before any model loads: the prompt file
holds prompts, the metric files exist (FID extractor and reference, CLIP folder, HPS checkpoint) and, on
rank 0, the metric models load (a weights file that would run code is refused there:
mulo_sd/nets/safe_files.py). A failure on any rank stops every rank (`on_every_rank`), so no rank decodes
its share of a run that cannot be scored.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import torch.distributed as dist
from omegaconf import DictConfig

from mulo_sd.evaluation.metrics.clip_score import check_clip_folder, load_clip
from mulo_sd.evaluation.metrics.fid import check_extractor_file, load_feature_extractor
from mulo_sd.evaluation.metrics.fid_protocols import check_protocol
from mulo_sd.evaluation.metrics.hpsv2 import HPS_MODEL, check_hps_file, load_hps
from mulo_sd.evaluation.prompt_sets import PromptSet, load_prompt_set
from mulo_sd.evaluation.real_evaluate import QualitySetup

log = logging.getLogger(__name__)
T = TypeVar("T")


def on_every_rank(step: Callable[[], T]) -> T:
    """`step()`'s result once it has succeeded on every rank of the group; when it raised on any rank, every
    rank raises: its own error, or one naming the rank that failed and why. In a single process: `step()`."""
    if not dist.is_initialized():
        return step()
    error, result = None, None
    try:
        result = step()
    except Exception as raised:  # every rank must reach the gather, or the others wait for it forever
        error = raised
    failures = [None] * dist.get_world_size()
    dist.all_gather_object(failures, None if error is None else f"{type(error).__name__}: {error}")
    if error is not None:
        raise error
    for rank, message in enumerate(failures):
        if message is not None:
            raise RuntimeError(f"rank {rank} stopped before decoding, so every rank stops: {message}")
    return result


def prepared_inputs(cfg: DictConfig, rank: int, device) -> tuple[PromptSet, QualitySetup | None]:
    """The prompt set (every rank) and, on rank 0, the loaded metric models, after checking every input
    file (module docstring)."""
    prompt_set = load_prompts(cfg)
    check_metric_files(cfg)
    return prompt_set, quality_setup(cfg, device) if rank == 0 else None


def load_prompts(cfg: DictConfig) -> PromptSet:
    """The prompt set of `prompts.file`; a file without prompts is an error naming it."""
    p = cfg.prompts
    prompt_set = load_prompt_set(p.file, p.format, p.count, p.seed, p.get("images"))
    if not prompt_set.prompts:
        skipped = f" ({prompt_set.skipped} skipped: {prompt_set.skip_reason})" if prompt_set.skipped else ""
        raise ValueError(f"prompts.file={prompt_set.source} holds no {p.format} prompts{skipped}")
    return prompt_set


def check_metric_files(cfg: DictConfig) -> None:
    """The FID extractor and reference (and a known FID protocol), the CLIP folder and the HPS checkpoint,
    when set, exist (errors name the knob or file)."""
    if cfg.fid.get("extractor"):
        if not cfg.fid.get("reference"):
            raise ValueError(
                "fid.extractor is set but fid.reference is not: a folder of real images or an .npz"
            )
        if not Path(cfg.fid.reference).exists():
            raise FileNotFoundError(f"fid.reference not found: {cfg.fid.reference}")
        check_extractor_file(cfg.fid.extractor)
        check_protocol(cfg.fid.protocol)
    if cfg.clip.get("model"):
        check_clip_folder(cfg.clip.model)
    if cfg.hps.get("checkpoint"):
        check_hps_file(cfg.hps.checkpoint)


def quality_setup(cfg: DictConfig, device) -> QualitySetup:
    """The metric models of `fid`, `clip` and `hps` (a metric left unset is not computed)."""
    setup = QualitySetup(batch_size=cfg.metric_batch_size, device=device)
    if cfg.fid.get("extractor"):
        trust = bool(cfg.fid.get("trust_pickle"))
        setup.fid_extractor = load_feature_extractor(cfg.fid.extractor, device, trust_pickle=trust)
        setup.fid_protocol, setup.fid_resolution = cfg.fid.protocol, cfg.fid.get("resolution")
    if cfg.clip.get("model"):
        setup.clip = load_clip(cfg.clip.model, device)
    if cfg.hps.get("checkpoint"):
        setup.hps = load_hps(cfg.hps.checkpoint, cfg.hps.get("model") or HPS_MODEL, device)
    if setup.fid_extractor is None and setup.clip is None and setup.hps is None:
        log.warning("no quality metric: set fid.extractor (+ fid.reference), hps.checkpoint or clip.model")
    return setup
