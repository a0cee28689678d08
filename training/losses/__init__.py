"""Losses shared by tokenizer and up/down-sampler training."""

from mulo_sd.training.losses.gan import (
    AdversarialLoss,
    PatchDiscriminator,
    adaptive_weight,
    hinge_d_loss,
    hinge_g_loss,
    non_saturating_d_loss,
    non_saturating_g_loss,
)
from mulo_sd.training.losses.lpips import LPIPS, backbone_weights_path
from mulo_sd.training.losses.pixel import pixel_loss
from mulo_sd.training.losses.token import (
    distribution_kl,
    hypothesis_cross_entropy,
    token_accuracy,
    token_cross_entropy,
)

__all__ = [
    "LPIPS",
    "AdversarialLoss",
    "PatchDiscriminator",
    "adaptive_weight",
    "backbone_weights_path",
    "distribution_kl",
    "hypothesis_cross_entropy",
    "hinge_d_loss",
    "hinge_g_loss",
    "non_saturating_d_loss",
    "non_saturating_g_loss",
    "pixel_loss",
    "token_accuracy",
    "token_cross_entropy",
]
