"""The up/down-sampler module's settings, checked, and the parts built from them (sampler_module.py): the
learned sampler (its outputs follow from the loss), the pixel-space twin validated instead of it
(`model.pixel`), the pixel-space path whose tokens are the cross-entropy's labels (`loss.ce_target`) and
the adversarial loss."""

from __future__ import annotations

import logging

from mulo_sd.training.losses import AdversarialLoss, PatchDiscriminator
from omegaconf import DictConfig, OmegaConf

from mulo_sd.nets.downsampler import Downsampler, DownsamplerConfig
from mulo_sd.nets.gpt import GPT
from mulo_sd.nets.pixel_samplers import MODES, PixelDownsampler, PixelUpsampler
from mulo_sd.nets.upsampler import Upsampler, UpsamplerConfig
from mulo_sd.nets.vq import VQModel

KINDS = ("up", "down")
PIXEL_PATHS = ("straight_through", "soft")
KL_CONTEXTS = ("truth", "draft")  # loss.kl_context: the grid the target is teacher-forced on
CE_TARGETS = ("truth", *MODES)  # loss.ce_target: the image's own tokens or a pixel-space path's

log = logging.getLogger(__name__)


def uses_pixels(loss: DictConfig) -> bool:
    return loss.mse_weight > 0 or loss.lpips_weight > 0 or loss.gan.weight > 0


def check_settings(kind: str, loss: DictConfig, ema: float | None) -> None:
    """The module's kind, its loss (`check_loss`) and its EMA decay."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got '{kind}'")
    check_loss(kind, loss)
    if ema is not None and not 0.0 < ema < 1.0:
        raise ValueError(f"ema must be a decay in (0, 1) or null, got {ema}")


def check_loss(kind: str, loss: DictConfig) -> None:
    names = ("ce_weight", "kl_weight", "latent_weight", "mse_weight", "lpips_weight")
    weights = {name: loss.get(name, 0.0) for name in names}
    weights["gan.weight"] = loss.gan.weight
    negative = {name: w for name, w in weights.items() if w < 0}
    if negative:
        raise ValueError(f"loss weights must be >= 0, got {negative}")
    if not any(weights.values()):
        raise ValueError(f"every loss weight is 0 ({weights}): set at least one > 0")
    if loss.get("kl_context", "truth") not in KL_CONTEXTS:
        raise ValueError(f"loss.kl_context must be one of {KL_CONTEXTS}, got '{loss.kl_context}'")
    ce_target = loss.get("ce_target", "truth")
    if ce_target not in CE_TARGETS:
        raise ValueError(f"loss.ce_target must be one of {CE_TARGETS}, got '{ce_target}'")
    if ce_target != "truth" and not (loss.ce_weight > 0 or weights["latent_weight"] > 0):
        raise ValueError(
            f"loss.ce_target={ce_target} sets the cross-entropy's labels, but loss.ce_weight is "
            f"{loss.ce_weight} and loss.latent_weight is {weights['latent_weight']}: set one of them > 0 or "
            "leave ce_target=truth"
        )
    if weights["latent_weight"] > 0 and ce_target == "truth":
        raise ValueError(
            "loss.latent_weight > 0 fits the up-sampler's code to a pixel-space path's encoder codes: set "
            "loss.ce_target to the path to distil (one of "
            f"{MODES}), got ce_target=truth"
        )
    if kind == "down" and ce_target != "truth":
        raise ValueError(
            "the down-sampler's cross-entropy labels are the down-scaled image's tokens: loss.ce_target "
            f"must be 'truth', got '{ce_target}'"
        )
    if loss.pixel_path not in PIXEL_PATHS:
        raise ValueError(f"loss.pixel_path must be one of {PIXEL_PATHS}, got '{loss.pixel_path}'")
    if kind == "down" and (uses_pixels(loss) or weights["kl_weight"] > 0):
        raise ValueError(
            "the down-sampler trains with token cross-entropy only (loss=token_ce): "
            f"kl_weight, mse_weight, lpips_weight and gan.weight must be 0, got {weights}"
        )
    if loss.gan.weight > 0 and loss.gan.weight_mode == "adaptive" and not loss.mse_weight + loss.lpips_weight:
        raise ValueError(
            "gan.weight_mode=adaptive balances the adversarial gradient against the pixel losses: "
            "set mse_weight or lpips_weight > 0, or gan.weight_mode=fixed"
        )


def check_image_size(image_size: int, r: int, vq: VQModel) -> None:
    if image_size % (r * vq.downsample_factor):
        raise ValueError(
            f"image_size {image_size} must be divisible by r * the tokenizer's downsample factor "
            f"= {r} * {vq.downsample_factor}"
        )


def upsampler_output(loss: DictConfig) -> str:
    """The UpsamplerConfig.output the loss trains: logits for cross-entropy, target distillation and the soft
    pixel path, a continuous code for the straight-through pixel path and latent distillation."""
    logits = loss.ce_weight > 0 or loss.get("kl_weight", 0.0) > 0
    logits = logits or (uses_pixels(loss) and loss.pixel_path == "soft")
    codes = uses_pixels(loss) and loss.pixel_path == "straight_through"
    codes = codes or loss.get("latent_weight", 0.0) > 0
    return "both" if logits and codes else "code" if codes else "logits"


def build_sampler(
    kind: str,
    r: int,
    vq: VQModel,
    sampler: DictConfig,
    loss: DictConfig,
    target: GPT | None = None,
    init_from: str | None = None,
) -> Upsampler | Downsampler:
    """The learned up- or down-sampler over `vq`'s codebook; `sampler` holds its config fields besides r,
    codebook_size, code_dim (from the tokenizer) and output (from the loss). `sampler.condition: caption`
    makes an up-sampler that reads the captions as `target` takes them (word ids or feature rows).
    `init_from`: a sampler folder whose weights it starts from (`initialise_sampler`)."""
    fields = OmegaConf.to_container(sampler, resolve=True)
    if "output" in fields:
        raise ValueError(
            "remove sampler.output: it follows from the loss (logits for ce_weight > 0 and "
            "pixel_path=soft, a code for pixel_path=straight_through)"
        )
    fields.update(r=r, codebook_size=vq.codebook_size, code_dim=vq.code_dim)
    if fields.get("hypotheses", 1) > 1 and (loss.ce_weight <= 0 or loss.get("ce_target", "truth") != "truth"):
        raise ValueError(
            "model.sampler.hypotheses > 1 trains by winner-takes-all cross-entropy against the true "
            "tokens: it needs loss.ce_weight > 0 and loss.ce_target=truth"
        )
    if fields.get("condition", "none") != "none":
        fields.update(caption_fields(kind, fields["condition"], target))
    if kind == "up":
        model = Upsampler(UpsamplerConfig(**fields, output=upsampler_output(loss)), vq.codebook)
    else:
        model = Downsampler(DownsamplerConfig(**fields), vq.codebook)
    if init_from is not None:
        initialise_sampler(model, init_from)
    return model


def caption_fields(kind: str, condition: str, target: GPT | None) -> dict:
    """The UpsamplerConfig fields of an up-sampler that reads the captions as the target does."""
    if kind != "up" or condition != "caption":
        raise ValueError(
            f"sampler.condition must be 'none' or 'caption' (an up-sampler that reads the captions as the "
            f"target takes them), got '{condition}' for a {kind}-sampler"
            + ("" if kind == "up" else ": only up-samplers read captions")
        )
    if target is None:
        raise ValueError(
            "sampler.condition=caption reads the captions as the target takes them: set model.target to the "
            "target's folder (and model.acceptance)"
        )
    config = target.config
    if config.cond_type == "words":
        return {"condition": "words", "condition_vocab": config.cond_vocab_size}
    return {"condition": "features", "condition_dim": config.caption_dim}


def initialise_sampler(sampler: Upsampler | Downsampler, folder: str) -> None:
    """Start from the weights of the sampler saved in `folder`: every tensor of it must fit; the tensors
    it lacks (a caption reader's, when it reads none) keep their init."""
    source = type(sampler).from_pretrained(folder)
    missing, unexpected = sampler.load_state_dict(source.state_dict(), strict=False)
    if unexpected:
        raise ValueError(f"init_from {folder} has weights the configured sampler lacks: {unexpected}")
    if missing:
        log.warning("init_from %s: %s keep their init (not in that folder)", folder, missing)


def build_pixel_sampler(
    kind: str, r: int, vq: VQModel, pixel: str | None
) -> PixelUpsampler | PixelDownsampler | None:
    """The pixel-space twin validated instead of the learned sampler (`model.pixel`), or None."""
    if pixel is None:
        return None
    if pixel not in MODES:
        raise ValueError(f"pixel must be one of {MODES} or null, got '{pixel}'")
    return PixelUpsampler(vq, r, pixel) if kind == "up" else PixelDownsampler(vq, r)


def build_ce_teacher(r: int, vq: VQModel, loss: DictConfig) -> PixelUpsampler | None:
    """The pixel-space path whose tokens are the cross-entropy's labels (loss.ce_target), if any."""
    ce_target = loss.get("ce_target", "truth")
    return None if ce_target == "truth" else PixelUpsampler(vq, r, ce_target)


def build_adversarial(gan: DictConfig) -> AdversarialLoss | None:
    """The PatchGAN loss of `loss.gan`, or None when its weight is 0."""
    if gan.weight > 0:
        return AdversarialLoss(
            PatchDiscriminator(**gan.discriminator),
            kind=gan.kind,
            start=gan.start,
            weight=gan.weight,
            weight_mode=gan.weight_mode,
        )
    return None
