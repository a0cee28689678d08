"""The pre-norm transformer block of the LlamaGen GPT, shared by the EAGLE draft head (eagle_head.py):
RMSNorm, attention with a fused `wqkv` projection, grouped KV heads and interleaved rotary positions, SwiGLU
feed-forward. Module and parameter names are LlamaGen's, so official checkpoints load by name.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from mulo_sd.nets.gpt_config import BlockDims


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x  # normalise in >= float32
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.type_as(x) * self.weight


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x)."""

    def __init__(self, config: BlockDims):
        super().__init__()
        self.w1 = nn.Linear(config.dim, config.ffn_hidden, bias=False)
        self.w3 = nn.Linear(config.dim, config.ffn_hidden, bias=False)
        self.w2 = nn.Linear(config.ffn_hidden, config.dim, bias=False)
        self.ffn_dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ffn_dropout(self.w2(F.silu(self.w1(x)) * self.w3(x)))


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the interleaved pairs (x[2i], x[2i+1]) of x [B, n, heads, head_dim]; cos, sin: [n, hd/2], or
    [B, n, hd/2] when every row has its own positions (GPT.step_rows)."""
    dtype = torch.promote_types(x.dtype, torch.float32)
    real, imag = x.to(dtype).unflatten(-1, (-1, 2)).unbind(-1)
    if cos.dim() == 2:
        cos, sin = cos[None], sin[None]
    cos, sin = cos.to(dtype)[:, :, None], sin.to(dtype)[:, :, None]
    rotated = torch.stack([real * cos - imag * sin, imag * cos + real * sin], dim=-1)
    return rotated.flatten(-2).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, config: BlockDims):
        super().__init__()
        self.n_head, self.n_kv_head, self.head_dim = config.n_head, config.kv_heads, config.head_dim
        self.wqkv = nn.Linear(config.dim, (config.n_head + 2 * config.kv_heads) * config.head_dim, bias=False)
        self.wo = nn.Linear(config.dim, config.dim, bias=False)
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, x, rotation, mask, cache=None, slots=None):
        """x [B, n, dim] at `slots` [n]. mask: bool [B, 1, n, keys] or None (plain causal). cache: (K, V)
        [B, kv_heads, S, head_dim] of the decode state; this call's K/V are written there at `slots` first,
        then the queries attend over all S slots (the mask says which are visible)."""
        batch, n, _ = x.shape
        kv_size = self.n_kv_head * self.head_dim
        q, k, v = self.wqkv(x).split([self.n_head * self.head_dim, kv_size, kv_size], dim=-1)
        q = q.view(batch, n, self.n_head, self.head_dim)
        k = k.view(batch, n, self.n_kv_head, self.head_dim)
        v = v.view(batch, n, self.n_kv_head, self.head_dim)
        if rotation is not None:
            q, k = apply_rotary(q, *rotation), apply_rotary(k, *rotation)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if cache is not None:
            keys, values = cache
            if slots.dim() == 1:
                keys.index_copy_(2, slots, k)
                values.index_copy_(2, slots, v)
            else:  # per-row slots [B, n] (GPT.step_rows)
                index = slots[:, None, :, None].expand_as(k)
                keys.scatter_(2, index, k)
                values.scatter_(2, index, v)
            k, v = keys, values
        if self.n_kv_head != self.n_head:
            k = k.repeat_interleave(self.n_head // self.n_kv_head, dim=1)
            v = v.repeat_interleave(self.n_head // self.n_kv_head, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None)
        return self.resid_dropout(self.wo(out.transpose(1, 2).reshape(batch, n, -1)))


class TransformerBlock(nn.Module):
    def __init__(self, config: BlockDims):
        super().__init__()
        self.attention = Attention(config)
        self.feed_forward = FeedForward(config)
        self.attention_norm = RMSNorm(config.dim, config.norm_eps)
        self.ffn_norm = RMSNorm(config.dim, config.norm_eps)

    def forward(self, x, rotation, mask, cache=None, slots=None):
        x = x + self.attention(self.attention_norm(x), rotation, mask, cache, slots)
        return x + self.feed_forward(self.ffn_norm(x))


def rotary_angles(position: str, head_dim: int, base: float, width: int, grid: torch.Tensor) -> torch.Tensor:
    """Rotation angles [n, head_dim/2] of grid indices [n] ('rope2d': rows then columns of a grid `width`
    wide; 'rope1d': the index), in float32 like LlamaGen's tables."""
    if position == "rope2d":
        half = head_dim // 2
        exponents = torch.arange(0, half, 2, device=grid.device)[: half // 2].float() / half
        freqs = 1.0 / base**exponents
        rows, cols = grid.div(width, rounding_mode="floor"), grid.remainder(width)
        return torch.cat([rows.float()[..., None] * freqs, cols.float()[..., None] * freqs], dim=-1)
    exponents = torch.arange(0, head_dim, 2, device=grid.device).float() / head_dim
    return grid.float()[..., None] * (1.0 / base**exponents)
