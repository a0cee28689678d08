"""What every decoding method returns: the token grid, the decoded image and the statistics."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mulo_sd.decoding.stats import DecodeStats


@dataclass
class DecodeResult:
    tokens: torch.Tensor  # int64 [B, h, w]
    image: torch.Tensor | None  # [B, 3, H, W] in [-1, 1]; None when no tokenizer was given
    stats: DecodeStats


def finish(tokens: torch.Tensor, stats: DecodeStats, tokenizer=None) -> DecodeResult:
    """Decode the image (timed as phase "image", outside `wall_seconds`) and pack the result."""
    image = None
    if tokenizer is not None:
        with stats.phase("image"):
            image = tokenizer.decode(tokens)
    return DecodeResult(tokens=tokens, image=image, stats=stats)
