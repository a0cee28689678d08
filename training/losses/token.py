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
