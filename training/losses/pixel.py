"""Pixel reconstruction losses on images in [-1, 1]: MSE (samplers, tokenizer) and L1 (tokenizer option)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

PIXEL_KINDS = ("mse", "l1")


def pixel_loss(
    prediction: torch.Tensor, target: torch.Tensor, kind: str = "mse", reduction: str = "mean"
) -> torch.Tensor:
    """Mean squared (`kind="mse"`) or absolute (`"l1"`) error between two image batches [B,C,H,W].

    `reduction="mean"` gives a scalar; `"per_sample"` gives one value per image, shape [B].
    """
    if prediction.shape != target.shape:
        raise ValueError(
            f"pixel_loss needs images of the same shape, got {tuple(prediction.shape)} "
            f"and {tuple(target.shape)}"
        )
    if kind == "mse":
        error = F.mse_loss(prediction, target, reduction="none")
    elif kind == "l1":
        error = F.l1_loss(prediction, target, reduction="none")
    else:
        raise ValueError(f"unknown pixel loss kind {kind!r}, expected one of {PIXEL_KINDS}")
    if reduction == "mean":
        return error.mean()
    if reduction == "per_sample":
        return error.flatten(1).mean(1)
    raise ValueError(f"unknown reduction {reduction!r}, expected 'mean' or 'per_sample'")
