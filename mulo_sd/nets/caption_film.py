"""The caption as an up-sampler's second input: a pooled caption vector turned into a per-channel scale and
shift (FiLM) for each stage of the up-sampler.

Why: the low-res draft cannot hold what is finer than its tokens (a striped background at 8x8 tokens), but
the caption names it. The up-sampler that also reads the caption can draft it, and the target, which reads
the same caption, accepts it where it would have drawn it.

The caption comes as the target GPT takes it: word ids [B, L] (the testbed, PAD_ID 0 ignored) or features
[B, L, D] with a mask [B, L] (T5 rows for LlamaGen, TA-Tok rows for Tar), mean-pooled over the real rows. The
scale and shift are the same at every position, so row causality is untouched. The last layer starts at zero:
a conditioned up-sampler starts as the unconditioned one it is initialised from.
"""

from __future__ import annotations

import torch
import torch.nn as nn

CONDITIONS = ("none", "words", "features")


class CaptionFiLM(nn.Module):
    """condition 'words' (a vocabulary of `vocab` word ids, 0 = padding) or 'features' (`dim`-wide rows)
    -> `stages` pairs (scale, shift), each [B, width, 1, 1]."""

    def __init__(self, condition: str, width: int, stages: int, vocab: int = 0, dim: int = 0):
        super().__init__()
        if condition == "words":
            self.embed = nn.Embedding(vocab, width, padding_idx=0)
        elif condition == "features":
            self.embed = nn.Linear(dim, width)
        else:
            raise ValueError(f"CaptionFiLM takes condition 'words' or 'features', got '{condition}'")
        self.condition, self.width, self.stages = condition, width, stages
        self.mlp = nn.Sequential(nn.Linear(width, width), nn.SiLU(), nn.Linear(width, 2 * width * stages))
        nn.init.zeros_(self.mlp[-1].weight)
        nn.init.zeros_(self.mlp[-1].bias)

    def pooled(self, cond: torch.Tensor, cond_mask: torch.Tensor | None) -> torch.Tensor:
        """The caption's mean embedding over its real rows: [B, width]."""
        if self.condition == "words":
            if cond.dim() != 2 or cond.is_floating_point():
                raise ValueError(
                    f"a word-conditioned up-sampler takes word ids [B, L], got {cond.dtype} "
                    f"{tuple(cond.shape)}"
                )
            real = (cond != 0).unsqueeze(-1)
            vectors = self.embed(cond)
        else:
            if cond.dim() != 3 or cond.shape[-1] != self.embed.in_features:
                raise ValueError(
                    f"a feature-conditioned up-sampler takes [B, L, {self.embed.in_features}] "
                    f"caption features, got {tuple(cond.shape)}"
                )
            real = torch.ones(cond.shape[:2], dtype=torch.bool, device=cond.device)
            if cond_mask is not None:
                real = cond_mask.to(device=cond.device, dtype=torch.bool)
            real = real.unsqueeze(-1)
            vectors = self.embed(cond.to(self.embed.weight.dtype))
        counts = real.sum(1).clamp(min=1)
        return (vectors * real).sum(1) / counts

    def forward(self, cond: torch.Tensor, cond_mask: torch.Tensor | None = None) -> list[tuple]:
        out = self.mlp(self.pooled(cond, cond_mask)).view(cond.shape[0], self.stages, 2, self.width, 1, 1)
        return [(out[:, i, 0], out[:, i, 1]) for i in range(self.stages)]


def modulate(x: torch.Tensor, film: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """x [B, C, h, w] scaled by 1 + scale and shifted, per channel."""
    scale, shift = film
    return x * (1 + scale.to(x.dtype)) + shift.to(x.dtype)
