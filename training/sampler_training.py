"""The up/down-sampler's training step (SamplerLightning, sampler_module.py; docs/algorithm.md section 10).

The up-sampler maps low-res tokens to high-res ones; its loss is any weighted mix of the paper's ablation rows
(conf/loss/): token cross-entropy against the high-res tokens, and pixel MSE / LPIPS / PatchGAN on the frozen
decoder's image of the predicted grid. The decoder is reached through a differentiable code: the
straight-through nearest codebook entry of a predicted continuous code (plus a commitment term), or the
softmax-weighted codebook of the logits (`pixel_path: soft`). The down-sampler maps high-res tokens to
low-res ones with cross-entropy against the tokens of the down-scaled image.

Optimisation is manual: a generator step, then a discriminator step once the adversarial loss is active.
The discriminator's step bypasses Lightning's step counter, so `global_step` (and `max_steps`, checkpoint
intervals) count generator steps in every loss row; `generator_step`, saved in checkpoints, decides when
the adversarial loss starts. With `trainer.accumulate_grad_batches=N` both accumulate N micro-batches per
step (training/accumulation.py); the adaptive GAN weight is measured on each micro-batch.

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
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from mulo_sd.training.accumulation import ends_accumulation
from mulo_sd.training.losses import distribution_kl, hypothesis_cross_entropy, pixel_loss, token_cross_entropy
from mulo_sd.training.optim import manual_step
from mulo_sd.training.sampler_setup import uses_pixels
from mulo_sd.training.sampler_target import teacher_forced_probs

from mulo_sd.nets.upsampler import soft_codes, straight_through_codes


class SamplerTraining:
    """SamplerLightning's training half: the loss terms of a batch, the target's distribution the KL loss
    fits, the manual optimisation step and the EMA update. It works on the module's parts (sampler, vq,
    target, losses: sampler_module.py)."""

    def generator_terms(self, batch: dict, step: int) -> tuple[dict, dict, torch.Tensor | None]:
        """(weighted loss terms, extra values to log, decoded prediction for the discriminator or None)."""
        c = self.loss_cfg
        up = self.kind == "up"
        inputs = self.token_grid(batch, self.low_size if up else self.high_size)
        terms, logs, fake = {}, {}, None
        # (pixel-only rows skip encoding the high-res image)
        needs_truth = c.ce_weight > 0 or c.get("kl_weight", 0.0) > 0
        truth = self.token_grid(batch, self.output_size) if needs_truth else None
        if up and self.sampler.hypotheses > 1:
            out = self.hypothesis_terms(batch, inputs, truth, terms, logs)
        else:
            out = self.sampler(inputs, **self.caption_of(batch))
        if not up:
            out = {"logits": out}
        if needs_truth:
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
        if c.ce_weight > 0 and "ce" not in terms:
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

    def hypothesis_terms(
        self, batch: dict, inputs: torch.Tensor, truth: torch.Tensor | None, terms: dict, logs: dict
    ) -> dict:
        """An up-sampler of several hypotheses: the winner-takes-all cross-entropy against the true tokens
        `truth` (loss.hypothesis_spread) into `terms`, how often each hypothesis wins into `logs`; returns the
        winners' outputs, which the other terms see (build_sampler refused losses without that term)."""
        c = self.loss_cfg
        every = self.sampler.all_hypotheses(inputs, **self.caption_of(batch))
        ce, winners = hypothesis_cross_entropy(every["logits"], truth, c.get("hypothesis_spread", 0.05))
        terms["ce"] = c.ce_weight * ce
        shares = torch.bincount(winners, minlength=self.sampler.hypotheses).float() / winners.numel()
        logs.update({f"wins_{k}": share for k, share in enumerate(shares)})
        rows = torch.arange(inputs.shape[0], device=inputs.device)
        return {name: value[rows, winners] for name, value in every.items()}

    def target_distribution(self, batch: dict, context: torch.Tensor) -> torch.Tensor:
        """The target's processed distribution at each position of the grid `context` [B,h,w] (the ground
        truth or the draft), teacher-forced with the batch's captions as the acceptance metric sees it:
        [B,V,h,w] probabilities."""
        cond, cond_mask = self.batch_condition(batch)
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
            manual_step(self, g_opt, self.optim_cfg.grad_clip)
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
