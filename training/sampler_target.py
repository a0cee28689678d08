"""The frozen target AR model of the up-sampler's training (sampler_module.py): loaded from its folder, it is
the teacher of `loss=target_kl` and the judge of the acceptance metric, both through its teacher-forced
distribution, the MuLo-SD accept rule's p_i (mulo_sd/decoding/accept.py)."""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
from mulo_sd.training.caption_condition import CaptionCondition
from mulo_sd.training.frozen import frozen
from omegaconf import DictConfig

from mulo_sd.decoding.accept import pooled_probability
from mulo_sd.decoding.sampling import SamplerConfig, process_logits
from mulo_sd.nets.gpt import GPT
from mulo_sd.nets.guidance import guide
from mulo_sd.nets.io import CONFIG_NAME
from mulo_sd.nets.vq import VQModel


def load_target(
    kind: str, folder: str | None, acceptance: DictConfig | None, vq: VQModel, image_size: int
) -> tuple[GPT | None, CaptionCondition | None, str]:
    """(the frozen target GPT, the condition it gets for a batch's captions, a note on the acceptance
    metric); (None, None, why) when it is skipped. The target must make the `image_size` px images' grids
    of `vq`'s codes."""
    if kind == "down":
        return None, None, "down-sampler: no acceptance metric"
    if folder is None or acceptance is None:
        return None, None, "skipped: no target (model.target) or acceptance settings given"
    if not (Path(folder) / CONFIG_NAME).is_file():
        note = (
            f"skipped: no target model at {folder} (train it with `mulo-train experiment=testbed/target "
            f"export={folder}`, or set model.target)"
        )
        warnings.warn(f"val/accept@tau not computed: {note}", UserWarning, stacklevel=3)
        return None, None, note
    if not acceptance.taus or any(not 0.0 <= tau <= 1.0 for tau in acceptance.taus):
        raise ValueError(f"acceptance.taus must be a non-empty list in [0, 1], got {acceptance.taus}")
    target = GPT.from_pretrained(folder)
    # word ids (testbed) or T5 features: from the batch's stored rows or acceptance.text_encoder's T5
    condition = CaptionCondition(
        target.config, acceptance.get("text_encoder"), acceptance.get("text_dtype") or "float32"
    )
    grid = (image_size // vq.downsample_factor,) * 2
    if target.vocab_size != vq.codebook_size or tuple(target.grid_size) != grid:
        raise ValueError(
            f"target {folder} has vocab_size {target.vocab_size} and grid {tuple(target.grid_size)}, but "
            f"the up-sampler makes {grid} grids of the tokenizer's {vq.codebook_size} codes"
        )
    taus = ", ".join(str(tau) for tau in acceptance.taus)
    note = f"target {folder}, k={acceptance.k}, tau in [{taus}], {dict(acceptance.sampler)}"
    return frozen(target), condition, note


def check_kl_teacher(loss: DictConfig, target: GPT | None, note: str) -> None:
    """`loss.kl_weight > 0` needs a target; `note` says why there is none."""
    if loss.get("kl_weight", 0.0) > 0 and target is None:
        raise ValueError(f"loss.kl_weight > 0 distils the target's distribution, but there is none ({note})")


@torch.no_grad()
def teacher_forced_probs(
    target: GPT,
    cond: torch.Tensor,
    truth: torch.Tensor,
    sampling: SamplerConfig,
    cond_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """The target's distribution at each position of the ground-truth grid `truth` [B, H, W], teacher-forced
    on its prefix with the condition `cond`, guided by `sampling.cfg_scale`, then `process_logits`:
    float32 [B, H*W, V]."""
    tokens = truth.flatten(1)
    keep = torch.zeros(tokens.shape[0], dtype=torch.bool, device=tokens.device)
    logits = target(tokens, cond, cond_mask, drop=keep)
    if sampling.cfg_scale != 1.0:
        logits = guide(logits, target(tokens, cond, cond_mask, drop=~keep), sampling.cfg_scale)
    return process_logits(logits, sampling)


@torch.no_grad()
def accepted_draft_tokens(
    target: GPT,
    cond: torch.Tensor,
    truth: torch.Tensor,
    draft: torch.Tensor,
    sampling: SamplerConfig,
    neighbours: torch.Tensor,
    k: int,
    taus: list[float],
    cond_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """How many draft tokens [B, H, W] the target accepts at each tau: int64 [len(taus)].

    The target is teacher-forced on the grid `truth` (the ground truth; the draft itself for the
    self-acceptance) with the captions' condition `cond` (word ids, or T5 features with their mask
    `cond_mask`: caption_condition.py), so position i's distribution p_i (guided by `sampling.cfg_scale`, then
    `process_logits`) is conditioned on that prefix; draft token
    x_i counts at tau when p_i(x_i and its k nearest codebook neighbours) >= tau."""
    probs = teacher_forced_probs(target, cond, truth, sampling, cond_mask).flatten(0, 1)
    pooled = pooled_probability(probs, draft.flatten(), neighbours, k)
    return torch.stack([(pooled >= tau).sum() for tau in taus])
