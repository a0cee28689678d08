"""The VQ image tokenizer: LlamaGen's CNN encoder, L2-normalised low-dimensional codebook and CNN decoder.

Module names and parameter shapes follow LlamaGen (FoundationVision/LlamaGen,
tokenizer/tokenizer_image/vq_model.py), so the official `vq_ds16_t2i.pt` (LlamaGen t2i, Tar AR-DTok) loads
with `mulo_sd.llamagen.vq_from_official(path)`. The testbed trains a tiny config of the same class.

Shapes: images [B,3,H,W] in [-1,1]; ids int64 [B,h,w] with h = H / downsample_factor; codes [B,D,h,w].
"""

from __future__ import annotations

import torch
import torch.nn as nn

from mulo_sd.nets.io import Pretrained
from mulo_sd.nets.vector_quantizer import VectorQuantizer
from mulo_sd.nets.vq_config import VQConfig
from mulo_sd.nets.vq_layers import Decoder, Encoder


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
