"""LightningModule that trains the VQ tokenizer: pixel + perceptual + VQ losses and an optional PatchGAN,
on every resolution the batch carries (the testbed tokenizes 128, 64 and 32 px images with one model).

Optimisation is manual (generator and discriminator take turns); with `trainer.accumulate_grad_batches=N`
both accumulate N micro-batches per step (training/accumulation.py), and the generator step counter, the
schedule and the codebook restarts count steps. Per micro-batch: the random crop and the adaptive GAN weight.
"""

from __future__ import annotations

import time
from pathlib import Path

import lightning as L
import torch
from mulo_sd.training.accumulation import ends_accumulation
from mulo_sd.training.checkpoints import config_node
from mulo_sd.training.losses import LPIPS, AdversarialLoss, PatchDiscriminator, pixel_loss
from mulo_sd.training.optim import adamw, manual_step, warmup_cosine_schedule
from omegaconf import DictConfig, OmegaConf

from mulo_sd.nets.vq import VQModel
from mulo_sd.nets.vq_config import VQConfig


def psnr(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Per-image PSNR in dB of images in [-1, 1] (peak-to-peak 2)."""
    mse = (prediction.clamp(-1, 1) - target).pow(2).flatten(1).mean(1)
    return 10 * torch.log10(4.0 / mse.clamp_min(1e-10))


class VQLightning(L.LightningModule):
    accumulates_gradients = True  # over trainer.accumulate_grad_batches micro-batches (training_step)

    def __init__(
        self,
        tokenizer: DictConfig,
        loss: DictConfig,
        optim: DictConfig,
        image_keys: list[str],
        codebook_restart_every: int = 0,
        train_crop: int | None = None,
    ):
        super().__init__()
        self.save_hyperparameters()
        tokenizer, loss, optim = config_node(tokenizer), config_node(loss), config_node(optim)
        self.automatic_optimization = False  # generator and discriminator take turns
        self.vq = VQModel(VQConfig(**OmegaConf.to_container(tokenizer, resolve=True)))
        self.loss_cfg = loss
        self.optim_cfg = optim
        self.image_keys = list(image_keys)
        self.codebook_restart_every = codebook_restart_every
        self.train_crop = train_crop
        self.lpips = LPIPS(**loss.lpips) if loss.perceptual_weight > 0 else None
        self.adversarial = None
        if loss.gan.weight > 0:
            disc = PatchDiscriminator(**loss.gan.discriminator)
            self.adversarial = AdversarialLoss(
                disc,
                kind=loss.gan.kind,
                start=loss.gan.start,
                weight=loss.gan.weight,
                weight_mode=loss.gan.weight_mode,
            )
        # Generator steps taken; saved in checkpoints. Lightning's global_step counts both optimisers.
        self.register_buffer("generator_step", torch.zeros((), dtype=torch.long))
        self.val_ids: dict[str, torch.Tensor] = {}
        self.last_step_time: float | None = None

    def configure_optimizers(self):
        g_opt = adamw(self.vq.parameters(), self.optim_cfg)
        schedule = warmup_cosine_schedule(g_opt, self.optim_cfg)
        if self.adversarial is None:
            return [g_opt], [schedule]
        d_opt = adamw(self.adversarial.discriminator.parameters(), self.optim_cfg)
        return [g_opt, d_opt], [schedule]

    def reconstruction_loss(self, recon: torch.Tensor, image: torch.Tensor) -> dict[str, torch.Tensor]:
        c = self.loss_cfg
        terms = {
            "l1": c.l1_weight * pixel_loss(recon, image, kind="l1"),
            "mse": c.mse_weight * pixel_loss(recon, image, kind="mse"),
        }
        if self.lpips is not None:
            terms["lpips"] = c.perceptual_weight * self.lpips(recon, image)
        return terms

    def training_step(self, batch: dict, batch_idx: int) -> None:
        optimizers = self.optimizers()
        g_opt, d_opt = (optimizers, None) if self.adversarial is None else optimizers
        step = int(self.generator_step)
        # Gradients add up over the window's micro-batches, each loss scaled by 1/N; the optimisers step at
        # its end, and DDP synchronises only then. toggle_model keeps the discriminator's weights out of the
        # generator's backward, which would otherwise add to the discriminator's accumulating gradients.
        stepping = ends_accumulation(self.trainer)
        scale = 1.0 / self.trainer.accumulate_grad_batches
        logs, total, fakes, reals = {}, 0.0, [], []
        with g_opt.toggle_model(sync_grad=stepping):
            for key in self.image_keys:
                image = self.random_crop(batch[key])
                recon, vq_losses = self.vq(image)
                terms = {**self.reconstruction_loss(recon, image), **vq_losses}
                if self.adversarial is not None:
                    rec = sum(terms.values())
                    terms["adv"], adv_logs = self.adversarial.generator_loss(
                        recon, step, rec, self.vq.decoder.conv_out.weight
                    )
                    logs.update({f"train/{k}_{key}": v for k, v in adv_logs.items()})
                    fakes.append(recon.detach())
                    reals.append(image)
                total = total + sum(terms.values())
                logs.update({f"train/{k}_{key}": v.detach() for k, v in terms.items()})
            self.manual_backward(total * scale)
        if stepping:
            manual_step(self, g_opt, self.optim_cfg.grad_clip)
        if self.adversarial is not None and self.adversarial.active(step):
            d_total = 0.0
            with d_opt.toggle_model(sync_grad=stepping):
                for real, fake in zip(reals, fakes, strict=True):
                    d_loss, d_logs = self.adversarial.discriminator_loss(real, fake, step)
                    d_total = d_total + d_loss
                    logs.update({f"train/{k}": v for k, v in d_logs.items()})
                self.manual_backward(d_total * scale)
            if stepping:
                d_opt.step()
                d_opt.zero_grad(set_to_none=True)
        if stepping:
            self.generator_step += 1
            if self.codebook_restart_every and int(self.generator_step) % self.codebook_restart_every == 0:
                logs["train/codebook_restarted"] = float(self.restart_dead_codes(batch[self.image_keys[0]]))
                logs["train/codebook_usage"] = self.vq.codebook_usage()
        now = time.perf_counter()
        if self.last_step_time is not None:
            logs["train/samples_per_s"] = batch[self.image_keys[0]].shape[0] / (now - self.last_step_time)
        self.last_step_time = now
        logs["train/loss"] = total.detach()
        logs["train/skipped_samples"] = batch["skipped"].float().sum() if "skipped" in batch else 0.0
        self.log_dict(logs, prog_bar=False, batch_size=batch[self.image_keys[0]].shape[0])
        self.log("loss", total.detach(), prog_bar=True, logger=False)

    def random_crop(self, images: torch.Tensor) -> torch.Tensor:
        """A random `train_crop` square of images larger than it (one offset per batch). Training on crops of
        the full-size images keeps their object scale at a fraction of the cost; the VQ is convolutional."""
        size = images.shape[-1]
        if not self.train_crop or size <= self.train_crop:
            return images
        top, left = torch.randint(size - self.train_crop + 1, (2,)).tolist()
        return images[..., top : top + self.train_crop, left : left + self.train_crop]

    @torch.no_grad()
    def restart_dead_codes(self, images: torch.Tensor) -> int:
        """Move codebook entries unused by the recent quantised vectors onto random current encoder outputs.

        A small L2-normalised codebook otherwise tends to collapse onto a handful of entries (seen on the
        testbed: one entry left after 400 steps). Returns how many entries were restarted."""
        quantizer = self.vq.quantize
        recent = quantizer.codebook_used[quantizer.codebook_used >= 0].long()
        dead = (torch.bincount(recent, minlength=self.vq.codebook_size) == 0).nonzero().squeeze(1)
        if dead.numel():
            z = self.vq.continuous_codes(images)
            z = quantizer.prepare(z.permute(0, 2, 3, 1).reshape(-1, z.shape[1]))
            pick = torch.randint(z.shape[0], (dead.numel(),), device=z.device)
            quantizer.embedding.weight[dead] = z[pick].to(quantizer.embedding.weight.dtype)
        return dead.numel()

    def on_validation_epoch_start(self) -> None:
        self.val_ids = {}

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        for key in self.image_keys:
            image = batch[key]
            ids = self.vq.encode(image)
            recon = self.vq.decode(ids)
            size = image.shape[-1]
            counts = torch.bincount(ids.flatten(), minlength=self.vq.codebook_size).float()
            self.val_ids[size] = self.val_ids.get(size, 0) + counts
            self.log(f"val/psnr_{size}", psnr(recon, image).mean(), batch_size=image.shape[0], sync_dist=True)
            self.log(
                f"val/l1_{size}", (recon - image).abs().mean(), batch_size=image.shape[0], sync_dist=True
            )

    def on_validation_epoch_end(self) -> None:
        for size, counts in self.val_ids.items():
            counts = self.all_gather(counts).reshape(-1, counts.numel()).sum(0)
            self.log(f"val/codebook_usage_{size}", (counts > 0).float().mean())

    def on_train_batch_start(self, batch, batch_idx) -> None:
        if self.generator_step == 0:
            self.last_step_time = None

    def export(self, folder: Path) -> Path:
        return self.vq.save_pretrained(folder)
