"""The up/down-sampler's validation (SamplerLightning, sampler_module.py): how fast decoding with it would be,
predicted on the fixed validation set.

The metrics: token accuracy, PSNR and LPIPS of the decoded prediction against the image, and for the
up-sampler the acceptance rate the target AR model gives the up-sampled draft: teacher-forced on the
ground-truth high-res prefix with the captions, the target's processed distribution p_i at each position, and
the fraction of draft tokens x_i with p_i(B_k(x_i)) >= tau (the MuLo-SD accept rule, accept.py), for each tau
of `acceptance.taus`; and `val/self_accept@tau`, the same with the target teacher-forced on the draft itself,
which is what decoding's verification sees.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
import torchvision
from lightning.pytorch.loggers import WandbLogger
from mulo_sd.training.sample_grid import labelled_grid
from mulo_sd.training.sampler_target import accepted_draft_tokens
from mulo_sd.training.vq_module import psnr
from omegaconf import DictConfig, OmegaConf

from mulo_sd.decoding.neighbours import codebook_neighbours
from mulo_sd.decoding.sampling import SamplerConfig


class SamplerValidation:
    """SamplerLightning's validation half: the acceptance settings, the metric sums of each validation step,
    their totals over ranks at the epoch's end, and the logged image grid. It works on the module's parts
    (sampler, vq, target, lpips: sampler_module.py)."""

    def setup_acceptance(self, acceptance: DictConfig) -> None:
        """The acceptance metric's k, taus and the target's SamplerConfig, and the k nearest codebook
        neighbours of every code (the accept rule pools their probability)."""
        self.taus = [float(tau) for tau in acceptance.taus]
        self.k = acceptance.k
        self.accept_sampling = SamplerConfig(**OmegaConf.to_container(acceptance.sampler, resolve=True))
        neighbours = codebook_neighbours(self.vq.codebook, self.k)
        self.register_buffer("neighbours", neighbours, persistent=False)

    def on_validation_epoch_start(self) -> None:
        names = ["ce", "correct", "tokens", "psnr", "lpips", "images"]
        if self.target is not None:
            names += [f"{kind}@{tau}" for kind in ("accept", "self_accept") for tau in self.taus]
        self.val_sums = {name: torch.zeros((), dtype=torch.float64, device=self.device) for name in names}
        self.sample_batch = None
        self.last_step_time = None  # the next training step's rate must not include validation time

    @staticmethod
    def validation_hypotheses(sampler, inputs: torch.Tensor) -> dict:
        """An up-sampler of several hypotheses is validated under each in turn across the batch, as decoding
        draws them (uniformly, one per image), not under hypothesis 0 alone."""
        count = getattr(sampler, "hypotheses", 1)
        if count <= 1:
            return {}
        return {"hypothesis": torch.arange(inputs.shape[0], device=inputs.device) % count}

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
            out = sampler(inputs, **self.caption_of(batch), **self.validation_hypotheses(sampler, inputs))
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
            cond, cond_mask = self.batch_condition(batch)
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
        size), named in the image, as a PNG in `folder` and, with W&B, as a logged image."""
        size = max(self.high_size, self.low_size)
        rows = [self.vq.decode(inputs), self.vq.decode(predicted), truth]
        rows = [F.interpolate(row.float(), size=(size, size), mode="nearest") for row in rows]
        rows = [row.add(1).div(2).clamp(0, 1) for row in rows]
        what = "up-sampled" if self.kind == "up" else "down-sampled"
        labels = ["input tokens (decoded)", f"{what} tokens (decoded)", "ground truth"]
        grid = labelled_grid(rows, labels)
        path = folder / f"step{self.global_step:06d}.png"
        folder.mkdir(parents=True, exist_ok=True)
        torchvision.utils.save_image(grid, path)
        if isinstance(self.logger, WandbLogger):
            caption = f"rows: {', '.join(labels)}"
            self.logger.log_image("val/samples", [grid], step=self.global_step, caption=[caption])
