"""PatchGAN discriminator and the adversarial loss (hinge or non-saturating, warm-up start, fixed or
adaptive weight), as in taming-transformers / LlamaGen's VQ training.

Usage from a manual-optimisation LightningModule, with `step` its own generator-step counter (Lightning's
`global_step` counts both optimisers' steps):

    adv_term, logs = adversarial.generator_loss(fake, step, rec_loss, last_layer)   # 0 before `start`
    (rec_loss + adv_term).backward(); g_opt.step()
    if adversarial.active(step):   # the discriminator is not updated before `start`
        d_opt.zero_grad()          # also clears what the generator step left in its gradients
        d_loss, logs = adversarial.discriminator_loss(real, fake, step)
        d_loss.backward(); d_opt.step()
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

ADVERSARIAL_KINDS = ("hinge", "non_saturating")
WEIGHT_MODES = ("fixed", "adaptive")


class PatchDiscriminator(nn.Module):
    """NLayerDiscriminator (pix2pix PatchGAN): `n_layers` 4x4 stride-2 convs, one 4x4 stride-1 conv, then a
    4x4 conv to one logit per patch. Output [B,1,H/2^n - 2,W/2^n - 2] (e.g. 30x30 for 256 px, n_layers=3)."""

    def __init__(self, in_channels: int = 3, channels: int = 64, n_layers: int = 3, norm: str = "batch"):
        super().__init__()
        if norm not in ("batch", "group"):
            raise ValueError(f"unknown discriminator norm {norm!r}, expected 'batch' or 'group'")
        if n_layers < 1:
            raise ValueError(f"n_layers must be >= 1, got {n_layers}")
        self.n_layers = n_layers

        def normalization(width: int) -> nn.Module:
            # GroupNorm with up to 32 groups that divide the width, so small test widths work too
            return nn.BatchNorm2d(width) if norm == "batch" else nn.GroupNorm(math.gcd(32, width), width)

        conv_bias = norm != "batch"  # BatchNorm's shift makes a conv bias redundant
        layers = [nn.Conv2d(in_channels, channels, 4, stride=2, padding=1), nn.LeakyReLU(0.2)]
        width = channels
        for i in range(1, n_layers + 1):
            new_width = channels * min(2**i, 8)
            stride = 2 if i < n_layers else 1
            layers += [
                nn.Conv2d(width, new_width, 4, stride=stride, padding=1, bias=conv_bias),
                normalization(new_width),
                nn.LeakyReLU(0.2),
            ]
            width = new_width
        layers.append(nn.Conv2d(width, 1, 4, stride=1, padding=1))
        self.layers = nn.Sequential(*layers)
        self.apply(_init_weights)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        smallest = 3 * 2**self.n_layers  # the two stride-1 4x4 convs need a 3x3 map after the stride-2 ones
        if min(images.shape[-2:]) < smallest:
            raise ValueError(
                f"PatchDiscriminator with n_layers={self.n_layers} needs images of at least {smallest} px, "
                f"got {tuple(images.shape[-2:])}"
            )
        return self.layers(images)


def _init_weights(module: nn.Module) -> None:
    if isinstance(module, nn.Conv2d):
        nn.init.normal_(module.weight, 0.0, 0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, (nn.BatchNorm2d, nn.GroupNorm)):
        nn.init.normal_(module.weight, 1.0, 0.02)
        nn.init.zeros_(module.bias)


def hinge_d_loss(logits_real: torch.Tensor, logits_fake: torch.Tensor) -> torch.Tensor:
    return 0.5 * (F.relu(1.0 - logits_real).mean() + F.relu(1.0 + logits_fake).mean())


def non_saturating_d_loss(logits_real: torch.Tensor, logits_fake: torch.Tensor) -> torch.Tensor:
    """-log sigmoid(real) - log(1 - sigmoid(fake)), written with softplus for stability."""
    return 0.5 * (F.softplus(-logits_real).mean() + F.softplus(logits_fake).mean())


def hinge_g_loss(logits_fake: torch.Tensor) -> torch.Tensor:
    return -logits_fake.mean()


def non_saturating_g_loss(logits_fake: torch.Tensor) -> torch.Tensor:
    return F.softplus(-logits_fake).mean()


def adaptive_weight(rec_loss: torch.Tensor, g_loss: torch.Tensor, last_layer: torch.Tensor) -> torch.Tensor:
    """taming's balance: ||d rec_loss / d last_layer|| / (||d g_loss / d last_layer|| + 1e-4), clamped to
    [0, 1e4] and detached, so the adversarial gradient at the generator's output layer is as large as the
    reconstruction gradient there."""
    rec_grad = torch.autograd.grad(rec_loss, last_layer, retain_graph=True)[0]
    g_grad = torch.autograd.grad(g_loss, last_layer, retain_graph=True)[0]
    return (rec_grad.norm() / (g_grad.norm() + 1e-4)).clamp(0.0, 1e4).detach()


class AdversarialLoss(nn.Module):
    """Holds the discriminator and turns its logits into the generator's adversarial term and the
    discriminator's loss. Both are exactly zero before generator step `start`."""

    def __init__(
        self,
        discriminator: nn.Module,
        kind: str = "hinge",
        start: int = 0,
        weight: float = 0.1,
        weight_mode: str = "fixed",
    ):
        super().__init__()
        if kind not in ADVERSARIAL_KINDS:
            raise ValueError(f"unknown adversarial loss kind {kind!r}, expected one of {ADVERSARIAL_KINDS}")
        if weight_mode not in WEIGHT_MODES:
            raise ValueError(
                f"unknown adversarial weight mode {weight_mode!r}, expected one of {WEIGHT_MODES}"
            )
        if start < 0:
            raise ValueError(f"adversarial start step must be >= 0, got {start}")
        self.discriminator = discriminator
        self.kind = kind
        self.start = start
        self.weight = weight
        self.weight_mode = weight_mode
        self.d_loss_fn = hinge_d_loss if kind == "hinge" else non_saturating_d_loss
        self.g_loss_fn = hinge_g_loss if kind == "hinge" else non_saturating_g_loss

    def active(self, step: int) -> bool:
        return step >= self.start

    def generator_loss(
        self,
        fake: torch.Tensor,
        step: int,
        rec_loss: torch.Tensor | None = None,
        last_layer: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Weighted adversarial term for the generator's loss, and detached values to log.

        The adaptive mode needs `rec_loss` (the rest of the generator's loss) and `last_layer` (the weight
        of the generator's output layer). With gradients disabled (validation) it cannot measure gradients
        and uses the base weight.
        """
        zero = fake.new_zeros(())
        if not self.active(step):
            return zero, {"g_adv": zero, "adv_weight": zero}
        g_loss = self.g_loss_fn(self.discriminator(fake))
        weight = torch.tensor(self.weight, device=fake.device)
        if self.weight_mode == "adaptive" and torch.is_grad_enabled():
            if rec_loss is None or last_layer is None:
                raise ValueError("weight_mode='adaptive' needs rec_loss and last_layer in generator_loss")
            weight = weight * adaptive_weight(rec_loss, g_loss, last_layer)
        return weight * g_loss, {"g_adv": g_loss.detach(), "adv_weight": weight}

    def discriminator_loss(
        self, real: torch.Tensor, fake: torch.Tensor, step: int
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Discriminator loss on real images and (detached) generated ones, and detached values to log.
        Before `start` it is a constant zero: check `active(step)` and skip the discriminator step."""
        zero = real.new_zeros(())
        if not self.active(step):
            return zero, {"d_loss": zero, "logits_real": zero, "logits_fake": zero}
        logits_real = self.discriminator(real.detach())
        logits_fake = self.discriminator(fake.detach())
        d_loss = self.d_loss_fn(logits_real, logits_fake)
        logs = {
            "d_loss": d_loss.detach(),
            "logits_real": logits_real.detach().mean(),
            "logits_fake": logits_fake.detach().mean(),
        }
        return d_loss, logs
