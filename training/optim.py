"""The optimiser and learning-rate schedule every training module uses: AdamW with linear warm-up, then cosine
decay, both read from a module's `optim` config (lr, betas, weight_decay, warmup_steps, total_steps,
min_lr_ratio)."""

from __future__ import annotations

import math

import torch
from omegaconf import DictConfig


def warmup_cosine(step: int, warmup: int, total: int, floor: float) -> float:
    """LR multiplier: linear warm-up, then cosine decay to `floor` at `total` steps."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))


def adamw(params, optim: DictConfig, weight_decay: float | None = None) -> torch.optim.AdamW:
    """AdamW over `params` (tensors or parameter groups) with weight_decay from `optim` unless given."""
    decay = optim.weight_decay if weight_decay is None else weight_decay
    return torch.optim.AdamW(params, lr=optim.lr, betas=tuple(optim.betas), weight_decay=decay)


def decay_matrices_only(params, weight_decay: float) -> list[dict]:
    """LlamaGen's split into AdamW groups: weight decay on matrices and embeddings, none on norm gains and
    biases."""
    params = list(params)
    return [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]


def warmup_cosine_schedule(
    optimizer: torch.optim.Optimizer, o: DictConfig
) -> torch.optim.lr_scheduler.LRScheduler:
    """Per-step LR multiplier `warmup_cosine` over `o.total_steps`."""
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: warmup_cosine(s, o.warmup_steps, o.total_steps, o.min_lr_ratio)
    )


def adamw_cosine(params, o: DictConfig) -> dict:
    """Lightning's `configure_optimizers` answer for an automatically optimised module: AdamW over LlamaGen's
    decay groups of `params`, stepped per optimiser step through the warm-up/cosine schedule."""
    optimizer = adamw(decay_matrices_only(params, o.weight_decay), o)  # each group sets its own weight_decay
    schedule = warmup_cosine_schedule(optimizer, o)
    return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


def clip_by_norm(module, optimizer: torch.optim.Optimizer, grad_clip: float | None) -> None:
    """Lightning's `configure_gradient_clipping` body: clip the gradient norm at `grad_clip` (0/None: off)."""
    if grad_clip:
        module.clip_gradients(optimizer, gradient_clip_val=grad_clip, gradient_clip_algorithm="norm")


def manual_step(module, optimizer: torch.optim.Optimizer, grad_clip: float | None) -> None:
    """A manually optimised module's generator step at the end of an accumulation window: clip the gradient
    norm at `grad_clip` (0/None: off), step, clear the gradients, advance the module's learning-rate
    schedule by one step."""
    clip_by_norm(module, optimizer, grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    module.lr_schedulers().step()
