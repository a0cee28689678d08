"""Token cross-entropy and accuracy for logits laid out [B,V,h,w] against token grids [B,h,w]."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _check_layout(logits: torch.Tensor, targets: torch.Tensor) -> None:
    if logits.dim() != 4 or targets.shape != (logits.shape[0], *logits.shape[2:]):
        raise ValueError(
            f"expected logits [B,V,h,w] and targets [B,h,w], got {tuple(logits.shape)} "
            f"and {tuple(targets.shape)}"
        )
    if targets.dtype != torch.long:
        raise ValueError(f"targets must be int64 token ids, got {targets.dtype}")


def token_cross_entropy(
    logits: torch.Tensor,
    targets: torch.Tensor,
    label_smoothing: float = 0.0,
    ignore_index: int | None = None,
) -> torch.Tensor:
    """Mean cross-entropy over all (non-ignored) grid positions."""
    _check_layout(logits, targets)
    return F.cross_entropy(
        logits,
        targets,
        label_smoothing=label_smoothing,
        ignore_index=-100 if ignore_index is None else ignore_index,  # -100 is torch's "nothing ignored"
    )


@torch.no_grad()
def token_accuracy(
    logits: torch.Tensor, targets: torch.Tensor, ignore_index: int | None = None
) -> torch.Tensor:
    """Fraction of (non-ignored) positions where the argmax token equals the target (NaN if none count)."""
    _check_layout(logits, targets)
    correct = logits.argmax(1) == targets
    if ignore_index is None:
        return correct.float().mean()
    counted = targets != ignore_index
    return (correct & counted).sum() / counted.sum()


def distribution_kl(logits: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    """Mean over grid positions of KL(teacher || softmax(logits)): logits [B,V,h,w] against the teacher's
    probabilities [B,V,h,w] (each position sums to 1). Its gradient is softmax(logits) - teacher, the
    soft-label cross-entropy's; the teacher's entropy only shifts the value, so a perfect match reads 0."""
    if logits.dim() != 4 or teacher.shape != logits.shape:
        raise ValueError(
            f"expected logits [B,V,h,w] and teacher probabilities of the same shape, got "
            f"{tuple(logits.shape)} and {tuple(teacher.shape)}"
        )
    log_q = F.log_softmax(logits.float(), dim=1)
    return (torch.xlogy(teacher, teacher) - teacher * log_q).sum(1).mean()


def hypothesis_cross_entropy(
    logits: torch.Tensor, targets: torch.Tensor, spread: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Winner-takes-all cross-entropy of K hypotheses: logits [B,K,V,h,w] against targets [B,h,w] ->
    (loss, winners [B]). Each grid's mean cross-entropy is taken under every hypothesis; the loss is
    (1 - spread) x the lowest one plus spread x their mean, averaged over the grids. Only the winner learns
    a grid (its mode), so the hypotheses split the grids' modes instead of all fitting their mean; `spread`
    keeps the losing ones from being left untrained."""
    if logits.dim() != 5:
        raise ValueError(f"expected logits [B,K,V,h,w], got {tuple(logits.shape)}")
    if not 0.0 <= spread <= 1.0:
        raise ValueError(f"spread must lie in [0, 1], got {spread}")
    b, k = logits.shape[:2]
    _check_layout(logits[:, 0], targets)
    every = F.cross_entropy(logits.flatten(0, 1), targets.repeat_interleave(k, 0), reduction="none")
    per_grid = every.view(b, k, -1).mean(2)
    lowest, winners = per_grid.min(1)
    loss = (1.0 - spread) * lowest.mean() + spread * per_grid.mean()
    return loss, winners
