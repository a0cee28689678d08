"""The VQ tokenizer's quantiser: nearest entry of an (optionally L2-normalised) codebook, LlamaGen's codebook,
commitment and entropy losses, and its `codebook_used` window of recent ids."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from mulo_sd.nets.vq_config import VQConfig

USAGE_WINDOW = 65536  # length of LlamaGen's `codebook_used` buffer: ids of the last 65536 quantised vectors
ENTROPY_TEMPERATURE = 0.01  # LlamaGen's softmax temperature for the entropy loss


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
