"""LightningModule that trains a learned up-sampler U_r or down-sampler D_r (docs/algorithm.md section 10)
against a frozen VQ tokenizer.

Each batch gives the high-res image ("image", image_size px) and the low-res one ("image_{image_size/r}",
the datamodule's area downscale of the same crop), tokenised on the fly by the frozen VQ, or pre-tokenised
grids ("tok{h}") when the batch carries them. The up-sampler maps low-res tokens to high-res ones, the
down-sampler high-res tokens to low-res ones.

The module is wired from its parts: sampler_setup.py checks the settings and builds the sampler (its outputs
follow from the loss), its pixel-space twin and the adversarial loss; sampler_target.py loads the target AR
model, the KL loss's teacher and the acceptance metric's judge; sampler_training.py holds the losses and the
manual optimisation step, sampler_validation.py the metrics that predict decoding speed.

The tokenizer and the target are loaded from their folders and kept out of checkpoints; a checkpoint whose
sampler was trained for another codebook than the configured tokenizer's is refused.
"""

from __future__ import annotations

import copy
import logging
from pathlib import Path

import lightning as L
import torch
import torch.nn as nn
from mulo_sd.training.checkpoints import config_node
from mulo_sd.training.frozen import frozen
from mulo_sd.training.losses import LPIPS
from mulo_sd.training.optim import adamw, warmup_cosine_schedule
from mulo_sd.training.sampler_setup import (
    build_adversarial,
    build_ce_teacher,
    build_pixel_sampler,
    build_sampler,
    check_image_size,
    check_settings,
)
from mulo_sd.training.sampler_target import check_kl_teacher, load_target
from mulo_sd.training.sampler_training import SamplerTraining
from mulo_sd.training.sampler_validation import SamplerValidation
from omegaconf import DictConfig

from mulo_sd.nets.upsampler import check_codebook_match
from mulo_sd.nets.vq import VQModel

log = logging.getLogger(__name__)

CONDITION_KEY = "_target_condition"  # the batch key of its computed condition (batch_condition)


class SamplerLightning(SamplerTraining, SamplerValidation, L.LightningModule):
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
        init_from: str | None = None,
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
        VQ-encode) instead of the learned sampler, as the tables' baseline row; it has nothing to train.
        init_from: a sampler folder whose weights start training (sampler_setup.initialise_sampler)."""
        super().__init__()
        self.save_hyperparameters()
        sampler, optim, loss = config_node(sampler), config_node(optim), config_node(loss)
        acceptance, images = config_node(acceptance), config_node(images)
        self.automatic_optimization = False  # generator and discriminator take turns
        check_settings(kind, loss, ema)
        self.kind, self.tokenizer = kind, tokenizer
        self.vq = frozen(VQModel.from_pretrained(tokenizer))
        check_image_size(image_size, r, self.vq)
        self.high_size, self.low_size = image_size, image_size // r
        self.target, self.condition, self.acceptance_note = load_target(
            kind, target, acceptance, self.vq, image_size
        )
        self.sampler = build_sampler(kind, r, self.vq, sampler, loss, self.target, init_from)
        self.pixel_sampler = build_pixel_sampler(kind, r, self.vq, pixel)
        self.ce_teacher = build_ce_teacher(r, self.vq, loss)
        has_logits = kind == "down" or self.sampler.config.output in ("logits", "both")
        self.has_logits = has_logits and pixel is None
        self.ema_sampler = copy.deepcopy(self.sampler).requires_grad_(False) if ema is not None else None
        self.ema_decay = ema
        self.optim_cfg, self.loss_cfg, self.images_cfg = optim, loss, images
        # the up-sampler's validation metric, and a training loss when lpips_weight > 0
        self.lpips = LPIPS(**loss.lpips, as_loss=loss.lpips_weight > 0) if kind == "up" else None
        self.adversarial = build_adversarial(loss.gan)
        # Generator steps taken; saved in checkpoints, decides when the adversarial loss starts.
        self.register_buffer("generator_step", torch.zeros((), dtype=torch.long))
        check_kl_teacher(loss, self.target, self.acceptance_note)
        if self.target is not None:
            self.setup_acceptance(acceptance)
        self.val_sums: dict[str, torch.Tensor] = {}
        self.sample_batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self.skipped_by_worker: dict[int, int] = {}
        self.last_step_time: float | None = None

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

    def export(self, folder: Path) -> Path:
        return self.eval_sampler.save_pretrained(folder)

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

    def batch_condition(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The target's (cond, cond_mask) for the batch's captions, computed once per batch and kept in it
        (under CONDITION_KEY): the up-sampler, the KL teacher and the acceptance metric share it, and for a
        T5-conditioned target without stored features it runs the text encoder."""
        if CONDITION_KEY not in batch:
            batch[CONDITION_KEY] = self.condition(batch, self.device)
        return batch[CONDITION_KEY]

    def caption_of(self, batch: dict) -> dict:
        """The keyword arguments that give a caption-reading up-sampler the batch's captions (as the target
        takes them); {} for a sampler that reads none."""
        if not getattr(self.sampler, "conditioned", False):
            return {}
        cond, cond_mask = self.batch_condition(batch)
        return {"cond": cond, "cond_mask": cond_mask}

    def grids(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """(input grid, target grid): (low, high) for the up-sampler, (high, low) for the down-sampler."""
        low, high = self.token_grid(batch, self.low_size), self.token_grid(batch, self.high_size)
        return (low, high) if self.kind == "up" else (high, low)

    @property
    def output_size(self) -> int:
        return self.high_size if self.kind == "up" else self.low_size
