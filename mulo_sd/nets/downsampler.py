"""The learned down-sampler D_r: a high-resolution token grid [B, H, W] -> low-resolution tokens
[B, H/r, W/r], trained with cross-entropy against the tokens of the down-scaled image.

Layout: token embedding (as the up-sampler's) -> PixelUnshuffle(r) (the r x r children of a low-res position
become its channels) -> 1x1 conv to `width` -> residual blocks of row-causal masked convs -> LayerNorm, SiLU
-> 1x1 conv to codebook logits.

MuLo-SD only down-samples verified rows, so plain convolutions would do; the blocks are row-causal anyway
(low-res row a depends only on high-res rows < r*(a+1)), so down-sampling a prefix whose last rows are
still partial never changes the low-res rows already given to the drafter.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from mulo_sd.nets.io import Pretrained
from mulo_sd.nets.masked_conv import ChannelLayerNorm, RowCausalBlock
from mulo_sd.nets.upsampler import TokenGridModel, check_sampler_fields, check_token_grid


@dataclass
class DownsamplerConfig:
    r: int  # scale: r x r high-res tokens become one low-res token
    codebook_size: int  # V of the tokenizer
    code_dim: int  # D of the tokenizer's codebook vectors
    embedding: str = "codebook"  # 'codebook': frozen codebook vectors + 1x1 conv; 'learned': [V, width] table
    width: int = 256
    blocks: int = 6
    kernel: int = 3
    norm: str = "layer"  # 'layer': LayerNorm over channels per position; 'none'

    def __post_init__(self):
        check_sampler_fields(self)


class Downsampler(TokenGridModel, Pretrained):
    """Learned row-causal down-sampler; build it with the tokenizer's codebook:
    `Downsampler(config, vq.codebook)` (`from_pretrained` needs none: the codebook is saved with the
    weights)."""

    kind = "downsampler"
    config_class = DownsamplerConfig

    def __init__(self, config: DownsamplerConfig, codebook: torch.Tensor | None = None):
        super().__init__(config, codebook)
        self.merge = nn.Conv2d(config.width * config.r * config.r, config.width, 1)
        self.blocks = nn.ModuleList(
            RowCausalBlock(config.width, config.kernel, config.norm) for _ in range(config.blocks)
        )
        self.norm_out = ChannelLayerNorm(config.width) if config.norm == "layer" else nn.Identity()
        self.head = nn.Conv2d(config.width, config.codebook_size, 1)

    def forward(self, ids_high: torch.Tensor) -> torch.Tensor:
        """ids_high [B, H, W] -> logits [B, V, H/r, W/r]."""
        check_token_grid(ids_high, self.codebook_size, "ids_high")
        height, width = ids_high.shape[1:]
        if height % self.r or width % self.r:
            raise ValueError(
                f"high-res grid {height}x{width} is not divisible by the down-sampler's r={self.r}"
            )
        x = self.merge(F.pixel_unshuffle(self.embed(ids_high), self.r))
        for block in self.blocks:
            x = block(x)
        return self.head(F.silu(self.norm_out(x)))

    @torch.no_grad()
    def downsample(self, ids_high: torch.Tensor) -> torch.Tensor:
        """ids_high [B, H, W] -> ids [B, H/r, W/r] (argmax of the logits)."""
        return self(ids_high).argmax(1)
