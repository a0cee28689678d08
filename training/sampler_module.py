"""LightningModule that trains a learned up-sampler U_r or down-sampler D_r (docs/algorithm.md section 10)
against a frozen VQ tokenizer.

Each batch gives the high-res image ("image", image_size px) and the low-res one ("image_{image_size/r}",
the datamodule's area downscale of the same crop), tokenised on the fly by the frozen VQ, or pre-tokenised
grids ("tok{h}") when the batch carries them. The up-sampler maps low-res tokens to high-res ones; its loss is
any weighted mix of the paper's ablation rows (conf/loss/): token cross-entropy against the high-res tokens,
and pixel MSE / LPIPS / PatchGAN on the frozen decoder's image of the predicted grid. The decoder is reached
through a differentiable code: the straight-through nearest codebook entry of a predicted continuous code
(plus a commitment term), or the softmax-weighted codebook of the logits (`pixel_path: soft`). The
up-sampler's outputs (logits, codes or both) follow from the loss. The down-sampler maps high-res tokens to
low-res ones with cross-entropy against the tokens of the down-scaled image.

Optimisation is manual: a generator step, then a discriminator step once the adversarial loss is active.
The discriminator's step bypasses Lightning's step counter, so `global_step` (and `max_steps`, checkpoint
intervals) count generator steps in every loss row; `generator_step`, saved in checkpoints, decides when
the adversarial loss starts. With `trainer.accumulate_grad_batches=N` both accumulate N micro-batches per
step (training/accumulation.py); the adaptive GAN weight is measured on each micro-batch.

Validation predicts decoding speed on the fixed validation set: token accuracy, PSNR and LPIPS of the decoded
prediction against the image, and for the up-sampler the acceptance rate the target AR model gives the
up-sampled draft: teacher-forced on the ground-truth high-res prefix with the captions, the target's processed
distribution p_i at each position, and the fraction of draft tokens x_i with p_i(B_k(x_i)) >= tau (the MuLo-SD
accept rule, accept.py), for each tau of `acceptance.taus`; and `val/self_accept@tau`, the same with the
target teacher-forced on the draft itself, which is what decoding's verification sees.

`loss.ce_target` picks the cross-entropy's labels: the image's own high-res tokens (`truth`), or for the
up-sampler the pixel-space path's tokens for the same low-res grid (`bicubic`, `bilinear`, `lanczos`:
VQ-decode, resize, VQ-encode): distillation of the training-free sampler into one that needs neither VQ pass.
`loss.latent_weight` distils the same path by regression instead of classification: the up-sampler's
continuous code is fitted (MSE) to the VQ encoder's code of the enlarged image before quantisation, as the
quantiser compares it with the codebook (L2-normalised for a normalised codebook); its draft is the nearest
codebook entry, so a close fit reproduces the pixel path's tokens and a near miss lands on a near code.

`loss=target_kl` fits the up-sampler to the target's distribution at each position, teacher-forced on the
ground truth (`loss.kl_context=truth`) or, on-policy, on the up-sampler's own argmax draft (`draft`: the
verification's context, so the draft is pulled toward tokens the target accepts around each other).

The tokenizer and the target are loaded from their folders and kept out of checkpoints; a checkpoint whose
sampler was trained for another codebook than the configured tokenizer's is refused.
"""

from __future__ import annotations

import copy
import logging
import time
import warnings
from pathlib import Path

import lightning as L
import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision
from lightning.pytorch.loggers import WandbLogger
from mulo_sd.training.accumulation import ends_accumulation
from mulo_sd.training.caption_condition import CaptionCondition
from mulo_sd.training.checkpoints import config_node
from mulo_sd.training.frozen import frozen
from mulo_sd.training.losses import (
    LPIPS,
    AdversarialLoss,
    PatchDiscriminator,
    distribution_kl,
    pixel_loss,
    token_cross_entropy,
)
from mulo_sd.training.optim import adamw, warmup_cosine_schedule
from mulo_sd.training.vq_module import psnr
from omegaconf import DictConfig, OmegaConf

from mulo_sd.decoding.accept import pooled_probability
from mulo_sd.decoding.neighbours import codebook_neighbours
from mulo_sd.decoding.sampling import SamplerConfig, process_logits
from mulo_sd.nets.downsampler import Downsampler, DownsamplerConfig
from mulo_sd.nets.gpt import GPT
from mulo_sd.nets.guidance import guide
from mulo_sd.nets.io import CONFIG_NAME
from mulo_sd.nets.pixel_samplers import MODES, PixelDownsampler, PixelUpsampler
from mulo_sd.nets.upsampler import (
    Upsampler,
    UpsamplerConfig,
    check_codebook_match,
    soft_codes,
    straight_through_codes,
)
from mulo_sd.nets.vq import VQModel

log = logging.getLogger(__name__)

KINDS = ("up", "down")
PIXEL_PATHS = ("straight_through", "soft")
KL_CONTEXTS = ("truth", "draft")  # loss.kl_context: the grid the target is teacher-forced on
CE_TARGETS = ("truth", *MODES)  # loss.ce_target: the image's own tokens or a pixel-space path's


def uses_pixels(loss: DictConfig) -> bool:
    return loss.mse_weight > 0 or loss.lpips_weight > 0 or loss.gan.weight > 0


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


def upsampler_output(loss: DictConfig) -> str:
    """The UpsamplerConfig.output the loss trains: logits for cross-entropy, target distillation and the soft
    pixel path, a continuous code for the straight-through pixel path and latent distillation."""
    logits = loss.ce_weight > 0 or loss.get("kl_weight", 0.0) > 0
    logits = logits or (uses_pixels(loss) and loss.pixel_path == "soft")
    codes = uses_pixels(loss) and loss.pixel_path == "straight_through"
    codes = codes or loss.get("latent_weight", 0.0) > 0
    return "both" if logits and codes else "code" if codes else "logits"


@torch.no_grad()
def accepted_draft_tokens(
    target: GPT,
    cond: torch.Tensor,
    truth: torch.Tensor,
    draft: torch.Tensor,
    sampling: SamplerConfig,
    neighbours: torch.Tensor,
    k: int,
    taus: list[float],
    cond_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """How many draft tokens [B, H, W] the target accepts at each tau: int64 [len(taus)].

    The target is teacher-forced on the grid `truth` (the ground truth; the draft itself for the
    self-acceptance) with the captions' condition `cond` (word ids, or T5 features with their mask
    `cond_mask`: caption_condition.py), so position i's distribution p_i (guided by `sampling.cfg_scale`, then
    `process_logits`) is conditioned on that prefix; draft token
    x_i counts at tau when p_i(x_i and its k nearest codebook neighbours) >= tau."""
    probs = teacher_forced_probs(target, cond, truth, sampling, cond_mask).flatten(0, 1)
    pooled = pooled_probability(probs, draft.flatten(), neighbours, k)
    return torch.stack([(pooled >= tau).sum() for tau in taus])


@torch.no_grad()
def teacher_forced_probs(
    target: GPT,
    cond: torch.Tensor,
    truth: torch.Tensor,
    sampling: SamplerConfig,
    cond_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """The target's distribution at each position of the ground-truth grid `truth` [B, H, W], teacher-forced
    on its prefix with the condition `cond`, guided by `sampling.cfg_scale`, then `process_logits`:
    float32 [B, H*W, V]."""
    tokens = truth.flatten(1)
    keep = torch.zeros(tokens.shape[0], dtype=torch.bool, device=tokens.device)
    logits = target(tokens, cond, cond_mask, drop=keep)
    if sampling.cfg_scale != 1.0:
        logits = guide(logits, target(tokens, cond, cond_mask, drop=~keep), sampling.cfg_scale)
    return process_logits(logits, sampling)


class SamplerLightning(L.LightningModule):
    accumulates_gradients = True  # over trainer.accumulate_grad_batches micro-batches (training_step)

    def __init__(
        self,
        kind: str,
        r: int,
        image_size: int,
        tokenizer: str,
        sampler: DictConfig,
        optim: DictConfig,
        loss: DictConfig,
        ema: float | None = None,
        target: str | None = None,
        acceptance: DictConfig | None = None,
        images: DictConfig | None = None,
        pixel: str | None = None,
    ):
        """kind: 'up' or 'down'. r: the scale between the grids. image_size: high-res px (the batch's "image";
        the low-res one is "image_{image_size // r}"). tokenizer: the frozen VQ folder. sampler: Upsampler /
        DownsamplerConfig fields besides r, codebook_size, code_dim (from the tokenizer) and output (from the
        loss). optim: lr, betas, weight_decay, warmup_steps, total_steps, min_lr_ratio, grad_clip. loss: see
        conf/loss/token_ce.yaml. ema: decay of an exponential moving average of the weights (validated and
        exported instead), or None. target: the target GPT folder for the acceptance metric (up-sampler only;
        missing folder or None: skipped with a note). acceptance: k, taus and the SamplerConfig fields of the
        target's distribution. images: count of validation examples drawn as an image grid, or None. pixel:
        an interpolation mode (pixel_samplers.MODES) to validate the pixel-space twin (VQ-decode, resize,
        VQ-encode) instead of the learned sampler, as the tables' baseline row; it has nothing to train."""
        super().__init__()
        self.save_hyperparameters()
        sampler, optim, loss = config_node(sampler), config_node(optim), config_node(loss)
        acceptance, images = config_node(acceptance), config_node(images)
        self.automatic_optimization = False  # generator and discriminator take turns
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got '{kind}'")
        check_loss(kind, loss)
        if ema is not None and not 0.0 < ema < 1.0:
            raise ValueError(f"ema must be a decay in (0, 1) or null, got {ema}")
        self.kind = kind
        self.tokenizer = tokenizer
        self.vq = frozen(VQModel.from_pretrained(tokenizer))
        scale = r * self.vq.downsample_factor
        if image_size % scale:
            raise ValueError(
                f"image_size {image_size} must be divisible by r * the tokenizer's downsample factor "
                f"= {r} * {self.vq.downsample_factor}"
            )
        self.high_size, self.low_size = image_size, image_size // r
        fields = OmegaConf.to_container(sampler, resolve=True)
        if "output" in fields:
            raise ValueError(
                "remove sampler.output: it follows from the loss (logits for ce_weight > 0 and "
                "pixel_path=soft, a code for pixel_path=straight_through)"
            )
        fields.update(r=r, codebook_size=self.vq.codebook_size, code_dim=self.vq.code_dim)
        if kind == "up":
            config = UpsamplerConfig(**fields, output=upsampler_output(loss))
            self.sampler = Upsampler(config, self.vq.codebook)
        else:
            self.sampler = Downsampler(DownsamplerConfig(**fields), self.vq.codebook)
        self.pixel_sampler = None
        if pixel is not None:
            if pixel not in MODES:
                raise ValueError(f"pixel must be one of {MODES} or null, got '{pixel}'")
            self.pixel_sampler = (
                PixelUpsampler(self.vq, r, pixel) if kind == "up" else PixelDownsampler(self.vq, r)
            )
        # the pixel-space path whose tokens are the cross-entropy's labels (loss.ce_target), if any
        ce_target = loss.get("ce_target", "truth")
        self.ce_teacher = None if ce_target == "truth" else PixelUpsampler(self.vq, r, ce_target)
        has_logits = kind == "down" or self.sampler.config.output in ("logits", "both")
        self.has_logits = has_logits and pixel is None
        self.ema_sampler = copy.deepcopy(self.sampler).requires_grad_(False) if ema is not None else None
        self.ema_decay = ema
        self.optim_cfg = optim
        self.loss_cfg = loss
        self.images_cfg = images
        # the up-sampler's validation metric, and a training loss when lpips_weight > 0
        self.lpips = LPIPS(**loss.lpips) if kind == "up" else None
        self.adversarial = None
        if loss.gan.weight > 0:
            self.adversarial = AdversarialLoss(
                PatchDiscriminator(**loss.gan.discriminator),
                kind=loss.gan.kind,
                start=loss.gan.start,
                weight=loss.gan.weight,
                weight_mode=loss.gan.weight_mode,
            )
        # Generator steps taken; saved in checkpoints, decides when the adversarial loss starts.
        self.register_buffer("generator_step", torch.zeros((), dtype=torch.long))
        self.target, self.acceptance_note = self.load_target(target, acceptance)
        if loss.get("kl_weight", 0.0) > 0 and self.target is None:
            raise ValueError(
                "loss.kl_weight > 0 distils the target's distribution, but there is none "
                f"({self.acceptance_note})"
            )
        if self.target is not None:
            self.taus = [float(tau) for tau in acceptance.taus]
            self.k = acceptance.k
            self.accept_sampling = SamplerConfig(**OmegaConf.to_container(acceptance.sampler, resolve=True))
            neighbours = codebook_neighbours(self.vq.codebook, self.k)
            self.register_buffer("neighbours", neighbours, persistent=False)
        self.val_sums: dict[str, torch.Tensor] = {}
        self.sample_batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self.skipped_by_worker: dict[int, int] = {}
        self.last_step_time: float | None = None

    def load_target(self, folder: str | None, acceptance: DictConfig | None) -> tuple[GPT | None, str]:
        """(the frozen target GPT, a note on the acceptance metric); (None, why) when it is skipped."""
        if self.kind == "down":
            return None, "down-sampler: no acceptance metric"
        if folder is None or acceptance is None:
            return None, "skipped: no target (model.target) or acceptance settings given"
        if not (Path(folder) / CONFIG_NAME).is_file():
            note = (
                f"skipped: no target model at {folder} (train it with `mulo-train experiment=testbed/target "
                f"export={folder}`, or set model.target)"
            )
            warnings.warn(f"val/accept@tau not computed: {note}", UserWarning, stacklevel=3)
            return None, note
        if not acceptance.taus or any(not 0.0 <= tau <= 1.0 for tau in acceptance.taus):
            raise ValueError(f"acceptance.taus must be a non-empty list in [0, 1], got {acceptance.taus}")
        target = GPT.from_pretrained(folder)
        # word ids (testbed) or T5 features: from the batch's stored rows or acceptance.text_encoder's T5
        self.condition = CaptionCondition(
            target.config, acceptance.get("text_encoder"), acceptance.get("text_dtype") or "float32"
        )
        grid = (self.high_size // self.vq.downsample_factor,) * 2
        if target.vocab_size != self.vq.codebook_size or tuple(target.grid_size) != grid:
            raise ValueError(
                f"target {folder} has vocab_size {target.vocab_size} and grid {tuple(target.grid_size)}, but "
                f"the up-sampler makes {grid} grids of the tokenizer's {self.vq.codebook_size} codes"
            )
        taus = ", ".join(str(tau) for tau in acceptance.taus)
        note = f"target {folder}, k={acceptance.k}, tau in [{taus}], {dict(acceptance.sampler)}"
        return frozen(target), note

    @property
    def eval_sampler(self) -> nn.Module:
        """The weights that are validated and exported: the EMA copy when there is one."""
        return self.sampler if self.ema_sampler is None else self.ema_sampler

    @property
    def leaves_parameters_unused(self) -> bool:
        """Under DDP: the discriminator is outside the loss until the GAN starts, the generator outside the
        discriminator's turn (see mulo_sd.training.train.strategy_for)."""
        return self.adversarial is not None

    def configure_optimizers(self):
        g_opt = adamw(self.sampler.parameters(), self.optim_cfg)
        schedule = warmup_cosine_schedule(g_opt, self.optim_cfg)
        if self.adversarial is None:
            return [g_opt], [schedule]
        d_opt = adamw(self.adversarial.discriminator.parameters(), self.optim_cfg, weight_decay=0.0)
        return [g_opt, d_opt], [schedule]

    def on_fit_start(self) -> None:
        notes = {"acceptance_metric": self.acceptance_note}
        if self.lpips is not None:
            notes["lpips_metric"] = self.lpips.describe()
        log.info("validation metrics: %s", notes)
        for logger in self.loggers:
            logger.log_hyperparams(notes)

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        codebook = checkpoint["state_dict"].get("sampler.codebook")
        if codebook is None:
            raise ValueError(
                "the checkpoint holds no up/down-sampler (no 'sampler.codebook'): wrong ckpt_path?"
            )
        try:
            check_codebook_match(f"the checkpoint's {self.sampler.kind}", codebook, self.vq)
        except ValueError as error:
            raise ValueError(f"{error} (configured tokenizer: model.tokenizer={self.tokenizer})") from None

    # ---- inputs ------------------------------------------------------------------------------------

    def image(self, batch: dict, size: int) -> torch.Tensor | None:
        return batch.get("image" if size == self.high_size else f"image_{size}")

    def token_grid(self, batch: dict, size: int) -> torch.Tensor:
        """Token grid of the `size` px image: pre-tokenised ("tok{h}") or encoded by the frozen VQ."""
        key = f"tok{size // self.vq.downsample_factor}"
        if key in batch:
            return batch[key]
        image = self.image(batch, size)
        if image is None:
            image_key = "image" if size == self.high_size else f"image_{size}"
            raise ValueError(
                f"the batch has neither {key!r} (pre-tokenised) nor {image_key!r}: add {size} to "
                f"data.extra_sizes (image_size / r), or {key} to data.token_keys"
            )
        # float32 like pre-tokenisation, so both give the same ids
        with torch.autocast(device_type=image.device.type, enabled=False):
            return self.vq.encode(image.float())

    def grids(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """(input grid, target grid): (low, high) for the up-sampler, (high, low) for the down-sampler."""
        low, high = self.token_grid(batch, self.low_size), self.token_grid(batch, self.high_size)
        return (low, high) if self.kind == "up" else (high, low)

    @property
    def output_size(self) -> int:
        return self.high_size if self.kind == "up" else self.low_size

    # ---- training ----------------------------------------------------------------------------------

    def generator_terms(self, batch: dict, step: int) -> tuple[dict, dict, torch.Tensor | None]:
        """(weighted loss terms, extra values to log, decoded prediction for the discriminator or None)."""
        c = self.loss_cfg
        up = self.kind == "up"
        inputs = self.token_grid(batch, self.low_size if up else self.high_size)
        out = self.sampler(inputs)
        if not up:
            out = {"logits": out}
        terms, logs, fake = {}, {}, None
        # (pixel-only rows skip encoding the high-res image)
        if c.ce_weight > 0 or c.get("kl_weight", 0.0) > 0:
            truth = self.token_grid(batch, self.output_size)
            logs["acc"] = (out["logits"].argmax(1) == truth).float().mean()
        labels = truth if c.ce_weight > 0 else None
        if self.ce_teacher is not None:
            with torch.autocast(device_type=inputs.device.type, enabled=False):  # float32, as decoding's
                latents = self.ce_teacher.latents(inputs)
                labels = self.vq.nearest_ids(latents)
            logs["acc_ce_target"] = (self.sampler.tokens(out) == labels).float().mean()
            if c.get("latent_weight", 0.0) > 0:
                b, d, h, w = latents.shape
                target = self.vq.prepared_codes(latents).view(b, h, w, d).permute(0, 3, 1, 2)
                terms["latent"] = c.latent_weight * F.mse_loss(out["codes"].float(), target)
        if c.ce_weight > 0:
            terms["ce"] = c.ce_weight * token_cross_entropy(out["logits"], labels, c.label_smoothing)
        if c.get("kl_weight", 0.0) > 0:
            context = truth if c.get("kl_context", "truth") == "truth" else out["logits"].detach().argmax(1)
            teacher = self.target_distribution(batch, context)
            terms["kl"] = c.kl_weight * distribution_kl(out["logits"], teacher)
        if uses_pixels(c):
            image = self.image(batch, self.high_size)
            if image is None:
                raise ValueError("pixel losses need the high-res image in the batch (data.load_images=true)")
            codebook = self.sampler.codebook
            if c.pixel_path == "straight_through":
                codes = straight_through_codes(out["codes"], codebook)
                terms["commit"] = c.commit_weight * F.mse_loss(out["codes"], codes.detach())
                last_layer = self.sampler.code_head.weight
            else:
                codes = soft_codes(out["logits"], codebook, c.soft_temperature)
                last_layer = self.sampler.logits_head.weight
            fake = self.vq.decode_codes(codes)
            if c.mse_weight > 0:
                terms["mse"] = c.mse_weight * pixel_loss(fake, image, kind="mse")
            if c.lpips_weight > 0:
                terms["lpips"] = c.lpips_weight * self.lpips(fake, image)
            if self.adversarial is not None:
                reconstruction = sum(terms[name] for name in ("mse", "lpips") if name in terms)
                terms["adv"], adv_logs = self.adversarial.generator_loss(
                    fake, step, reconstruction, last_layer
                )
                logs.update(adv_logs)
        return terms, logs, fake

    def target_distribution(self, batch: dict, context: torch.Tensor) -> torch.Tensor:
        """The target's processed distribution at each position of the grid `context` [B,h,w] (the ground
        truth or the draft), teacher-forced with the batch's captions as the acceptance metric sees it:
        [B,V,h,w] probabilities."""
        cond, cond_mask = self.condition(batch, self.device)
        probs = teacher_forced_probs(self.target, cond, context, self.accept_sampling, cond_mask)
        return probs.transpose(1, 2).reshape(context.shape[0], -1, *context.shape[1:])

    def training_step(self, batch: dict, batch_idx: int) -> None:
        if self.pixel_sampler is not None:
            raise ValueError(
                "model.pixel validates the pixel-space sampler, which has no weights: run it with "
                "validate_first=true trainer.max_steps=0"
            )
        optimizers = self.optimizers()
        g_opt, d_opt = (optimizers, None) if self.adversarial is None else optimizers
        step = int(self.generator_step)
        # Gradients add up over the window's micro-batches, each loss scaled by 1/N; the optimisers step at
        # its end, and DDP synchronises only then. toggle_model keeps the discriminator's weights out of the
        # generator's backward, which would otherwise add to the discriminator's accumulating gradients.
        stepping = ends_accumulation(self.trainer)
        scale = 1.0 / self.trainer.accumulate_grad_batches
        with g_opt.toggle_model(sync_grad=stepping):
            terms, logs, fake = self.generator_terms(batch, step)
            total = sum(terms.values())
            self.manual_backward(total * scale)
        if stepping:
            if self.optim_cfg.grad_clip:
                self.clip_gradients(
                    g_opt, gradient_clip_val=self.optim_cfg.grad_clip, gradient_clip_algorithm="norm"
                )
            g_opt.step()
            g_opt.zero_grad(set_to_none=True)
            self.lr_schedulers().step()
        if self.adversarial is not None and self.adversarial.active(step):
            real = self.image(batch, self.high_size)
            with d_opt.toggle_model(sync_grad=stepping):
                d_loss, d_logs = self.adversarial.discriminator_loss(real, fake, step)
                self.manual_backward(d_loss * scale)
            if stepping:
                # through the strategy (precision, DDP), not LightningOptimizer.step: that would count the
                # discriminator's step in global_step, and max_steps would mean fewer generator steps
                self.trainer.strategy.optimizer_step(d_opt.optimizer, closure=lambda: None, model=self)
                d_opt.zero_grad(set_to_none=True)
            logs.update(d_logs)
        if stepping:
            self.generator_step += 1
            self.update_ema()

        batch_size = len(batch["key"])
        logs = {f"train/{name}": value.detach() for name, value in {**terms, **logs}.items()}
        logs["train/loss"] = total.detach()
        now = time.perf_counter()
        if self.last_step_time is not None:
            logs["train/samples_per_s"] = batch_size / (now - self.last_step_time)
            self.log("samples/s", logs["train/samples_per_s"], prog_bar=True, logger=False)
        self.last_step_time = now
        if "skipped" in batch:  # each DataLoader worker reports its own running count
            self.skipped_by_worker[int(batch["worker"])] = int(batch["skipped"])
        logs["train/skipped_samples"] = float(sum(self.skipped_by_worker.values()))
        self.log_dict(logs, batch_size=batch_size)
        self.log("loss", total.detach(), prog_bar=True, logger=False, batch_size=batch_size)

    @torch.no_grad()
    def update_ema(self) -> None:
        if self.ema_sampler is None:
            return
        for ema_param, param in zip(self.ema_sampler.parameters(), self.sampler.parameters(), strict=True):
            ema_param.lerp_(param, 1.0 - self.ema_decay)

    # ---- validation --------------------------------------------------------------------------------

    def on_validation_epoch_start(self) -> None:
        names = ["ce", "correct", "tokens", "psnr", "lpips", "images"]
        if self.target is not None:
            names += [f"{kind}@{tau}" for kind in ("accept", "self_accept") for tau in self.taus]
        self.val_sums = {name: torch.zeros((), dtype=torch.float64, device=self.device) for name in names}
        self.sample_batch = None
        self.last_step_time = None  # the next training step's rate must not include validation time

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        inputs, truth = self.grids(batch)
        sampler, sums = self.eval_sampler, self.val_sums
        if self.pixel_sampler is not None:
            out = {}
            if self.kind == "up":
                predicted = self.pixel_sampler.upsample(inputs)
            else:
                predicted = self.pixel_sampler.downsample(inputs)
        else:
            out = sampler(inputs)
            if self.kind == "down":
                out = {"logits": out}
            predicted = out["logits"].argmax(1) if "logits" in out else sampler.tokens(out)
        if "logits" in out:
            sums["ce"] += F.cross_entropy(out["logits"].float(), truth, reduction="sum").double()
        sums["correct"] += (predicted == truth).sum()
        sums["tokens"] += truth.numel()
        image = self.image(batch, self.output_size)
        if image is not None:
            decoded = self.vq.decode(predicted).float()
            sums["psnr"] += psnr(decoded, image.float()).sum().double()
            if self.lpips is not None:
                sums["lpips"] += self.lpips(decoded, image.float(), reduction="per_sample").sum().double()
            sums["images"] += image.shape[0]
        if self.target is not None:
            cond, cond_mask = self.condition(batch, self.device)
            accepted = accepted_draft_tokens(
                self.target, cond, truth, predicted, self.accept_sampling, self.neighbours, self.k, self.taus,
                cond_mask,
            )  # fmt: skip
            on_itself = accepted_draft_tokens(
                self.target, cond, predicted, predicted, self.accept_sampling, self.neighbours, self.k,
                self.taus, cond_mask,
            )  # fmt: skip
            for tau, count, own in zip(self.taus, accepted, on_itself, strict=True):
                sums[f"accept@{tau}"] += count
                sums[f"self_accept@{tau}"] += own
        if self.sample_batch is None and self.images_cfg is not None:
            count = self.images_cfg.count
            truth_image = image if image is not None else self.vq.decode(truth)
            self.sample_batch = (inputs[:count], predicted[:count], truth_image[:count])

    def on_validation_epoch_end(self) -> None:
        names = list(self.val_sums)
        totals = self.all_gather(torch.stack([self.val_sums[name] for name in names]))
        totals = dict(zip(names, totals.reshape(-1, len(names)).sum(0).tolist(), strict=True))
        metrics = {"val/acc": totals["correct"] / totals["tokens"]}
        if self.has_logits:
            metrics["val/ce"] = totals["ce"] / totals["tokens"]
        if totals["images"]:
            metrics["val/psnr"] = totals["psnr"] / totals["images"]
            if self.lpips is not None:
                metrics["val/lpips"] = totals["lpips"] / totals["images"]
        if self.target is not None:
            for tau in self.taus:
                metrics[f"val/accept@{tau}"] = totals[f"accept@{tau}"] / totals["tokens"]
                metrics[f"val/self_accept@{tau}"] = totals[f"self_accept@{tau}"] / totals["tokens"]
        self.log_dict(metrics)
        if self.sample_batch is not None and self.logger is not None:
            folder = Path(self.trainer.log_dir) / "samples"  # log_dir broadcasts: every rank must ask
            if self.trainer.is_global_zero:
                self.log_images(folder, *self.sample_batch)

    @torch.no_grad()
    def log_images(
        self, folder: Path, inputs: torch.Tensor, predicted: torch.Tensor, truth: torch.Tensor
    ) -> None:
        """Rows: the decoded input grid, the decoded prediction, the ground-truth image (all at the larger
        size), as a PNG in `folder` and, with W&B, as a logged image."""
        size = max(self.high_size, self.low_size)
        rows = [self.vq.decode(inputs), self.vq.decode(predicted), truth]
        rows = [F.interpolate(row.float(), size=(size, size), mode="nearest") for row in rows]
        images = torch.cat(rows).add(1).div(2).clamp(0, 1)
        grid = torchvision.utils.make_grid(images, nrow=inputs.shape[0], padding=2, pad_value=1.0)
        path = folder / f"step{self.global_step:06d}.png"
        folder.mkdir(parents=True, exist_ok=True)
        torchvision.utils.save_image(grid, path)
        if isinstance(self.logger, WandbLogger):
            what = "up-sampled" if self.kind == "up" else "down-sampled"
            caption = f"rows: input tokens (decoded), {what} tokens (decoded), ground truth"
            self.logger.log_image("val/samples", [grid], step=self.global_step, caption=[caption])

    def export(self, folder: Path) -> Path:
        return self.eval_sampler.save_pretrained(folder)
