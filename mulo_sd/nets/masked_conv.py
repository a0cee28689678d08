"""Row-causal convolutions: output row a sees input rows <= a (all columns), the building block of the learned
up- and down-samplers.

MuLo-SD drafts whole low-resolution rows and up-samples only the new ones, so a high-resolution row must not
depend on low-resolution rows that are not drafted yet. Masking the kernel taps below the centre row gives
that property to any stack of these convolutions, as long as nothing else mixes rows: the normalisation is
per position over channels (`ChannelLayerNorm`), never GroupNorm/BatchNorm, whose statistics span all rows.

A stack of blocks whose masked convolutions have `kernel // 2` rows of reach sees `context_rows(blocks)` rows
above an output row, so up-sampling new rows needs only that many rows of context (see `Upsampler`).
`causal=False` keeps every tap (a plain size-preserving conv): for an up-sampler that sees the rows below as
well, like the pixel-space path, when the whole low-res grid is drafted at once (MuLo-SD's default).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

NORMS = ("layer", "none")


class RowCausalConv2d(nn.Conv2d):
    """A size-preserving Conv2d (odd square kernel, zero padding, stride 1) whose taps below the centre row
    are zero (`causal=False`: none are). The mask multiplies the weight in every forward, so an optimiser step
    (Adam moments, weight decay) that moves a masked raw weight never reaches the output; `masked_weight` is
    the kernel in use."""

    def __init__(
        self, in_channels: int, out_channels: int, kernel_size: int, bias: bool = True, causal: bool = True
    ):
        if kernel_size < 1 or kernel_size % 2 == 0:
            raise ValueError(
                f"kernel_size must be a positive odd int (centre row = own row), got {kernel_size}"
            )
        super().__init__(in_channels, out_channels, kernel_size, padding=kernel_size // 2, bias=bias)
        mask = torch.ones(kernel_size, kernel_size)
        if causal:
            mask[kernel_size // 2 + 1 :] = 0.0
        # not persistent: it follows from kernel_size, so checkpoints hold only the weights
        self.register_buffer("mask", mask, persistent=False)
        with torch.no_grad():
            self.weight.mul_(self.mask)  # so the raw weights read as they act

    @property
    def rows_above(self) -> int:
        """Input rows above the output row that the kernel reaches."""
        return self.kernel_size[0] // 2

    @property
    def masked_weight(self) -> torch.Tensor:
        return self.weight * self.mask

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._conv_forward(x, self.masked_weight, self.bias)


class ChannelLayerNorm(nn.Module):
    """LayerNorm over the channels of each position of [B, C, H, W]: no statistic crosses rows."""

    def __init__(self, channels: int):
        super().__init__()
        self.norm = nn.LayerNorm(channels, eps=1e-6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class RowCausalBlock(nn.Module):
    """Residual block: x + pointwise(SiLU(masked conv(norm(x)))). The pointwise conv adds capacity without
    adding row reach."""

    def __init__(self, width: int, kernel: int, norm: str, causal: bool = True):
        super().__init__()
        if norm not in NORMS:
            raise ValueError(
                f"norm must be one of {NORMS}, got '{norm}' (GroupNorm/BatchNorm pool statistics over all "
                f"rows and would break row causality)"
            )
        self.norm = ChannelLayerNorm(width) if norm == "layer" else nn.Identity()
        self.conv = RowCausalConv2d(width, width, kernel, causal=causal)
        self.pointwise = nn.Conv2d(width, width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.pointwise(F.silu(self.conv(self.norm(x))))


def context_rows(blocks: nn.ModuleList) -> int:
    """Rows above an output row that a stack of RowCausalBlocks reaches: the sum of the convs' reaches."""
    return sum(block.conv.rows_above for block in blocks)
