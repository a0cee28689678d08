"""Classifier-free guidance on logits, shared by the GPT's decoding state and the samplers."""

import torch


def guide(cond_logits: torch.Tensor, uncond_logits: torch.Tensor, scale: float) -> torch.Tensor:
    """Classifier-free guidance on logits: u + s * (c - u). `scale == 1` returns the conditional logits."""
    if scale == 1.0:
        return cond_logits
    return uncond_logits + scale * (cond_logits - uncond_logits)
