"""The VQ tokenizer's CNN encoder and decoder (LlamaGen tokenizer/tokenizer_image/vq_model.py): resolution
levels of ResNet blocks, single-head attention at the lowest resolution, stride-2 downsampling and
nearest-neighbour upsampling. Module names are LlamaGen's, so its state dicts load by name.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from mulo_sd.nets.vq_config import VQConfig


def group_norm(channels: int, groups: int) -> nn.GroupNorm:
    return nn.GroupNorm(groups, channels, eps=1e-6)


class ResnetBlock(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, dropout: float, groups: int):
        super().__init__()
        self.norm1 = group_norm(in_channels, groups)
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, padding=1)
        self.norm2 = group_norm(out_channels, groups)
        self.dropout = nn.Dropout(dropout)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1)
        # a 1x1 projection only where the width changes (Identity has no weights, so no state-dict key)
        self.nin_shortcut = (
            nn.Conv2d(in_channels, out_channels, 1) if in_channels != out_channels else nn.Identity()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        h = self.conv2(self.dropout(F.silu(self.norm2(h))))
        return self.nin_shortcut(x) + h


class AttnBlock(nn.Module):
    """Single-head self-attention over all positions, with 1x1-conv projections."""

    def __init__(self, channels: int, groups: int):
        super().__init__()
        self.norm = group_norm(channels, groups)
        self.q = nn.Conv2d(channels, channels, 1)
        self.k = nn.Conv2d(channels, channels, 1)
        self.v = nn.Conv2d(channels, channels, 1)
        self.proj_out = nn.Conv2d(channels, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        y = self.norm(x)
        q, k, v = (conv(y).flatten(2).transpose(1, 2) for conv in (self.q, self.k, self.v))  # [B, hw, C]
        y = F.scaled_dot_product_attention(q, k, v)  # scale 1/sqrt(C), as LlamaGen; memory-efficient kernel
        return x + self.proj_out(y.transpose(1, 2).reshape(b, c, h, w))


class Downsample(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.pad(x, (0, 1, 0, 1)))  # pad right/bottom only: halves even sizes exactly


class Upsample(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


def level_block(res: list[nn.Module], attn: list[nn.Module], resample: nn.Module, name: str) -> nn.Module:
    """One resolution level: `res` blocks, `attn` blocks after them (lowest level only), then resampling."""
    block = nn.Module()
    block.res = nn.ModuleList(res)
    block.attn = nn.ModuleList(attn)
    setattr(block, name, resample)
    return block


def run_level(block: nn.Module, h: torch.Tensor) -> torch.Tensor:
    for i, res in enumerate(block.res):
        h = res(h)
        if len(block.attn):
            h = block.attn[i](h)
    return h


class Encoder(nn.Module):
    def __init__(self, config: VQConfig):
        super().__init__()
        ch, mult, g, p = config.ch, config.encoder_ch_mult, config.norm_groups, config.dropout_p
        self.conv_in = nn.Conv2d(3, ch, 3, padding=1)
        self.conv_blocks = nn.ModuleList()
        block_in = ch
        for level, m in enumerate(mult):
            lowest = level == len(mult) - 1
            res, attn = [], []
            for _ in range(config.num_res_blocks):
                res.append(ResnetBlock(block_in, ch * m, p, g))
                block_in = ch * m
                if lowest:  # attention only at the lowest resolution, where it is cheap
                    attn.append(AttnBlock(block_in, g))
            down = nn.Identity() if lowest else Downsample(block_in)
            self.conv_blocks.append(level_block(res, attn, down, "downsample"))
        self.mid = nn.ModuleList(
            [
                ResnetBlock(block_in, block_in, p, g),
                AttnBlock(block_in, g),
                ResnetBlock(block_in, block_in, p, g),
            ]
        )
        self.norm_out = group_norm(block_in, g)
        self.conv_out = nn.Conv2d(block_in, config.z_channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv_in(x)
        for block in self.conv_blocks:
            h = block.downsample(run_level(block, h))
        for layer in self.mid:
            h = layer(h)
        return self.conv_out(F.silu(self.norm_out(h)))


class Decoder(nn.Module):
    def __init__(self, config: VQConfig):
        super().__init__()
        ch, mult, g, p = config.ch, config.decoder_ch_mult, config.norm_groups, config.dropout_p
        block_in = ch * mult[-1]
        self.conv_in = nn.Conv2d(config.z_channels, block_in, 3, padding=1)
        self.mid = nn.ModuleList(
            [
                ResnetBlock(block_in, block_in, p, g),
                AttnBlock(block_in, g),
                ResnetBlock(block_in, block_in, p, g),
            ]
        )
        self.conv_blocks = nn.ModuleList()  # lowest resolution first
        for level in reversed(range(len(mult))):
            lowest = level == len(mult) - 1
            res, attn = [], []
            for _ in range(config.num_res_blocks + 1):
                res.append(ResnetBlock(block_in, ch * mult[level], p, g))
                block_in = ch * mult[level]
                if lowest:
                    attn.append(AttnBlock(block_in, g))
            up = Upsample(block_in) if level != 0 else nn.Identity()
            self.conv_blocks.append(level_block(res, attn, up, "upsample"))
        self.norm_out = group_norm(block_in, g)
        self.conv_out = nn.Conv2d(block_in, 3, 3, padding=1)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        h = self.conv_in(z)
        for layer in self.mid:
            h = layer(h)
        for block in self.conv_blocks:
            h = block.upsample(run_level(block, h))
        return self.conv_out(F.silu(self.norm_out(h)))
