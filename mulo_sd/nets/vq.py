"""The VQ image tokenizer: LlamaGen's CNN encoder, L2-normalised low-dimensional codebook and CNN decoder.

Module names and parameter shapes follow LlamaGen (FoundationVision/LlamaGen,
tokenizer/tokenizer_image/vq_model.py), so the official `vq_ds16_t2i.pt` (LlamaGen t2i, Tar AR-DTok) loads
with `VQModel.from_official(path)`. The testbed trains a tiny config of the same class.

Shapes: images [B,3,H,W] in [-1,1]; ids int64 [B,h,w] with h = H / downsample_factor; codes [B,D,h,w].
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from mulo_sd.llamagen.official import OfficialCheckpoint, read_official
from mulo_sd.llamagen.official_configs import vq_fields
from mulo_sd.nets.io import Pretrained

USAGE_WINDOW = 65536  # length of LlamaGen's `codebook_used` buffer: ids of the last 65536 quantised vectors
ENTROPY_TEMPERATURE = 0.01  # LlamaGen's softmax temperature for the entropy loss


@dataclass
class VQConfig:
    """Field names up to `dropout_p` are LlamaGen's `ModelArgs`; the defaults are its VQ-16."""

    codebook_size: int = 16384
    codebook_embed_dim: int = 8
    codebook_l2_norm: bool = True
    codebook_show_usage: bool = True  # keeps LlamaGen's `quantize.codebook_used` buffer
    commit_loss_beta: float = 0.25
    entropy_loss_ratio: float = 0.0
    encoder_ch_mult: list[int] = field(default_factory=lambda: [1, 1, 2, 2, 4])
    decoder_ch_mult: list[int] = field(default_factory=lambda: [1, 1, 2, 2, 4])
    z_channels: int = 256
    dropout_p: float = 0.0
    ch: int = 128  # base channel count (LlamaGen's Encoder/Decoder default)
    num_res_blocks: int = 2
    norm_groups: int = 32  # GroupNorm groups; LlamaGen uses 32, small channel counts may want fewer

    def __post_init__(self):
        # Hydra and JSON hand over list-likes; keep plain int lists so the config serialises as written
        self.encoder_ch_mult = [int(m) for m in self.encoder_ch_mult]
        self.decoder_ch_mult = [int(m) for m in self.decoder_ch_mult]
        if not self.encoder_ch_mult or len(self.encoder_ch_mult) != len(self.decoder_ch_mult):
            raise ValueError(
                f"encoder_ch_mult {self.encoder_ch_mult} and decoder_ch_mult {self.decoder_ch_mult} must be "
                f"non-empty and of equal length (the decoder upsamples as often as the encoder downsamples)"
            )
        channels = sorted({self.ch * m for m in self.encoder_ch_mult + self.decoder_ch_mult})
        indivisible = [c for c in channels if c % self.norm_groups]
        if indivisible:
            raise ValueError(
                f"norm_groups={self.norm_groups} must divide every channel count {channels}; "
                f"{indivisible} are not divisible (lower norm_groups or change ch / ch_mult)"
            )

    @property
    def downsample_factor(self) -> int:
        return 2 ** (len(self.encoder_ch_mult) - 1)

    @classmethod
    def llamagen_ds16(cls, **overrides) -> VQConfig:
        """LlamaGen's `VQ_16` (the architecture of vq_ds16_t2i.pt and vq_ds16_c2i.pt)."""
        return cls(**{"encoder_ch_mult": [1, 1, 2, 2, 4], "decoder_ch_mult": [1, 1, 2, 2, 4], **overrides})

    @classmethod
    def llamagen_ds8(cls, **overrides) -> VQConfig:
        """LlamaGen's `VQ_8`."""
        return cls(**{"encoder_ch_mult": [1, 2, 2, 4], "decoder_ch_mult": [1, 2, 2, 4], **overrides})


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


def entropy_loss(affinity: torch.Tensor) -> torch.Tensor:
    """Low per-vector entropy (confident assignment) minus high batch entropy (spread over the codebook)."""
    logits = affinity / ENTROPY_TEMPERATURE
    probs = F.softmax(logits, dim=-1)
    sample_entropy = -(probs * F.log_softmax(logits, dim=-1)).sum(-1).mean()
    mean_probs = probs.mean(0)
    batch_entropy = -(mean_probs * torch.log(mean_probs + 1e-5)).sum()
    return sample_entropy - batch_entropy


class VectorQuantizer(nn.Module):
    def __init__(self, config: VQConfig):
        super().__init__()
        self.config = config
        self.embedding = nn.Embedding(config.codebook_size, config.codebook_embed_dim)
        nn.init.uniform_(self.embedding.weight, -1.0 / config.codebook_size, 1.0 / config.codebook_size)
        if config.codebook_l2_norm:
            with torch.no_grad():
                self.embedding.weight.copy_(F.normalize(self.embedding.weight, dim=-1))
        if config.codebook_show_usage:
            # ids stored as floats (LlamaGen's layout); -1 marks slots not yet filled
            self.register_buffer("codebook_used", torch.full((USAGE_WINDOW,), -1.0))

    @property
    def codebook(self) -> torch.Tensor:
        weight = self.embedding.weight
        return F.normalize(weight, dim=-1) if self.config.codebook_l2_norm else weight

    def prepare(self, z_flat: torch.Tensor) -> torch.Tensor:
        return F.normalize(z_flat, dim=-1) if self.config.codebook_l2_norm else z_flat

    def distances(self, z_flat: torch.Tensor) -> torch.Tensor:
        """Squared distances [N, V] from prepared vectors [N, D] to the codebook, in float32 even under
        autocast (low precision would change which entry is nearest)."""
        with torch.autocast(device_type=z_flat.device.type, enabled=False):
            z, e = z_flat.float(), self.codebook.float()
            return z.pow(2).sum(1, keepdim=True) + e.pow(2).sum(1) - 2 * z @ e.t()

    def forward(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        b, d, h, w = z.shape
        z_flat = self.prepare(z.permute(0, 2, 3, 1).reshape(-1, d))
        dist = self.distances(z_flat)
        ids = dist.argmin(1)
        z_q = self.codebook[ids].to(z_flat.dtype)
        if self.config.codebook_show_usage and self.training:
            self.record_usage(ids)
        losses = {
            "codebook": F.mse_loss(z_q, z_flat.detach()),  # moves the entries towards the encoder outputs
            "commit": self.config.commit_loss_beta * F.mse_loss(z_flat, z_q.detach()),
            "entropy": (
                self.config.entropy_loss_ratio * entropy_loss(-dist)
                if self.config.entropy_loss_ratio > 0
                else z_flat.new_zeros(())
            ),
        }
        codes = z_flat + (z_q - z_flat).detach()  # straight-through: forward is z_q, gradient goes to z
        return codes.view(b, h, w, d).permute(0, 3, 1, 2), ids.view(b, h, w), losses

    @torch.no_grad()
    def record_usage(self, ids: torch.Tensor) -> None:
        recent = ids[-USAGE_WINDOW:].to(self.codebook_used.dtype)
        self.codebook_used.copy_(torch.cat([self.codebook_used[len(recent) :], recent]))

    def usage(self) -> float:
        used = self.codebook_used[self.codebook_used >= 0]
        return used.unique().numel() / self.config.codebook_size


class VQModel(nn.Module, Pretrained):
    """LlamaGen VQ tokenizer. `encode`/`decode` for the runtime; `forward`, `quantize_codes` and the
    differentiable `decode_codes` for training."""

    kind = "vq"
    config_class = VQConfig

    def __init__(self, config: VQConfig):
        super().__init__()
        self.config = config
        self.encoder = Encoder(config)
        self.decoder = Decoder(config)
        self.quantize = VectorQuantizer(config)
        self.quant_conv = nn.Conv2d(config.z_channels, config.codebook_embed_dim, 1)
        self.post_quant_conv = nn.Conv2d(config.codebook_embed_dim, config.z_channels, 1)

    @property
    def downsample_factor(self) -> int:
        return self.config.downsample_factor

    @property
    def codebook_size(self) -> int:
        return self.config.codebook_size

    @property
    def code_dim(self) -> int:
        return self.config.codebook_embed_dim

    @property
    def codebook(self) -> torch.Tensor:
        """[V, D]: the vectors the decoder sees (unit-norm when `codebook_l2_norm`)."""
        return self.quantize.codebook

    def codebook_usage(self) -> float:
        """Fraction of the codebook among the ids of the last 65536 vectors quantised in training mode."""
        if not self.config.codebook_show_usage:
            raise ValueError("codebook usage is only tracked with codebook_show_usage=True")
        return self.quantize.usage()

    def check_images(self, images: torch.Tensor) -> None:
        if images.dim() != 4 or images.shape[1] != 3:
            raise ValueError(f"images must be [B, 3, H, W], got shape {tuple(images.shape)}")
        height, width = images.shape[-2:]
        f = self.downsample_factor
        if height % f or width % f:
            raise ValueError(f"image size {height}x{width} is not divisible by the downsample factor {f}")

    def check_codes(self, codes: torch.Tensor) -> None:
        if codes.dim() != 4 or codes.shape[1] != self.code_dim:
            raise ValueError(f"codes must be [B, {self.code_dim}, h, w], got shape {tuple(codes.shape)}")

    def check_ids(self, ids: torch.Tensor) -> None:
        if ids.dim() != 3:
            raise ValueError(f"ids must be [B, h, w], got shape {tuple(ids.shape)}")
        if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
            raise ValueError(f"ids must be an integer tensor, got {ids.dtype}")
        if ids.numel() and (ids.min() < 0 or ids.max() >= self.codebook_size):
            raise ValueError(
                f"ids must lie in [0, {self.codebook_size}), got range [{ids.min()}, {ids.max()}]"
            )

    def continuous_codes(self, images: torch.Tensor) -> torch.Tensor:
        """Encoder output before quantisation, [B, D, h, w]."""
        self.check_images(images)
        return self.quant_conv(self.encoder(images))

    def quantize_codes(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """Nearest codebook entry of continuous codes z [B, D, h, w] -> (codes with a straight-through
        gradient to z, ids [B, h, w], losses). The losses are already weighted (commit by beta, entropy by
        its ratio), so their sum is the VQ term of the training loss."""
        self.check_codes(z)
        return self.quantize(z)

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [B, h, w] -> codes [B, D, h, w]."""
        self.check_ids(ids)
        return self.codebook[ids].permute(0, 3, 1, 2)

    def prepared_codes(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B, D, h, w] as the quantiser compares them with the codebook (L2-normalised for a normalised
        codebook), [B*h*w, D]."""
        self.check_codes(codes)
        return self.quantize.prepare(codes.permute(0, 2, 3, 1).reshape(-1, codes.shape[1]))

    def nearest_ids(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B, D, h, w] -> ids [B, h, w] of the nearest entries, by the rule `encode` uses."""
        z_flat = self.prepared_codes(codes)
        b, _, h, w = codes.shape
        return self.quantize.distances(z_flat).argmin(1).view(b, h, w)

    @torch.no_grad()
    def encode(self, images: torch.Tensor) -> torch.Tensor:
        """images [B, 3, H, W] in [-1, 1] -> ids int64 [B, H/f, W/f]."""
        return self.nearest_ids(self.continuous_codes(images))

    @torch.no_grad()
    def decode(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [B, h, w] -> images [B, 3, h*f, w*f] clamped to [-1, 1]."""
        return self.decode_codes(self.lookup(ids)).clamp(-1.0, 1.0)

    def decode_codes(self, codes: torch.Tensor) -> torch.Tensor:
        """Differentiable decoding of codes [B, D, h, w] as the quantiser outputs them; not clamped, so
        pixel losses keep their gradient."""
        self.check_codes(codes)
        return self.decoder(self.post_quant_conv(codes))

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Training pass: (reconstruction, unclamped; VQ losses as in `quantize_codes`)."""
        codes, _, losses = self.quantize(self.continuous_codes(images))
        return self.decode_codes(codes), losses

    @classmethod
    def from_official(
        cls,
        path: str | Path | OfficialCheckpoint,
        device: str | torch.device = "cpu",
        *,
        weights: str = "model",
        trust_pickle: bool = False,
        **config_overrides,
    ) -> VQModel:
        """Load a LlamaGen VQ file (`{"model": state_dict, ...}`, e.g. vq_ds16_t2i.pt, or a training
        checkpoint with its "ema" weights and `args`), by path or as an `OfficialCheckpoint` already read.
        File reading, safe unpickling and `trust_pickle`: mulo_sd/llamagen/official.py.

        The config comes from the file (official_configs.vq_fields): the architecture from the weights'
        shapes, the quantiser's settings from its stored training args, then `config_overrides` (VQConfig
        fields, e.g. norm_groups). weights: "model" (what LlamaGen's sample scripts load) or "ema".
        Save the result with `save_pretrained`."""
        if isinstance(path, OfficialCheckpoint):  # already read (mulo-convert reads it once)
            checkpoint = path
        else:
            checkpoint = read_official(
                path,
                trust_pickle=trust_pickle,
                missing_hint="download LlamaGen's VQ checkpoint (vq_ds16_t2i.pt from the LlamaGen release) "
                "and pass its path; nothing is downloaded at run time",
            )
        path = checkpoint.path
        checkpoint.expect("llamagen-vq")
        state = checkpoint.weights(weights)
        config = VQConfig(**vq_fields(checkpoint, state, **config_overrides).values)
        model = cls(config)
        expected = model.state_dict()
        missing = sorted(set(expected) - set(state))
        unexpected = sorted(set(state) - set(expected))
        mismatched = [
            f"{k} {tuple(state[k].shape)} != {tuple(v.shape)}"
            for k, v in expected.items()
            if k in state and state[k].shape != v.shape
        ]
        if missing or unexpected or mismatched:
            raise ValueError(
                f"{path} does not match {model.config}: {len(missing)} missing keys {missing[:8]}, "
                f"{len(unexpected)} unexpected keys {unexpected[:8]}, {len(mismatched)} shape mismatches "
                f"{mismatched[:8]}; pass config overrides (codebook_size, codebook_embed_dim, ch_mult ...) "
                f"that match the checkpoint"
            )
        model.load_state_dict(state)
        return model.to(device).eval()
