"""LightningModules that train SceneEval on SynthScenes ground truth.

`SceneEvalLightning` trains the whole model: squared error of every (colour, shape) pair's density map
against its target (one unit-mass blob per object, so the map sums to the count) plus a masked MSE on the
centroids of the pairs present. Validation scores the real validation images against their own captions
with the same checks used on generated images, so `val/score` (mean per-prompt score) should approach 1.

`SceneEvalBackgroundLightning` adds the background head to a trained SceneEval (`init_from`) and trains
only the head, with cross-entropy against the scene's background kind; the trunk stays frozen and in eval
mode (BatchNorm statistics included), so every score and FD feature of the model stays bit for bit as it
was. Validation reports the background accuracy (`val/background_acc`, per kind too).

Generated images reach SceneEval through the tokenizer's decoder, which blurs edges and shifts colours. With
`tokenizer` set, a fraction `reconstruct_prob` of the training images is replaced by its VQ round trip
(encode -> decode), and validation also reads the round trips of the real images (`val/score_vq`,
`val/background_acc_vq`): how well it reads a tokenizer-perfect generation."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F
from mulo_sd.training.checkpoints import config_node
from mulo_sd.training.frozen import frozen
from mulo_sd.training.optim import adamw, warmup_cosine_schedule
from omegaconf import DictConfig, OmegaConf

from mulo_sd.nets.vq import VQModel
from mulo_sd.testbed.scene_checks import CHECK_KINDS, check_results
from mulo_sd.testbed.scene_truth import background_targets, batch_targets, density_targets
from mulo_sd.testbed.sceneeval import SceneEval, SceneEvalConfig
from mulo_sd.testbed.synthscenes import BACKGROUNDS


class RoundTripTraining(L.LightningModule):
    """What both SceneEval modules share: the frozen tokenizer whose round trips replace a fraction of the
    training images, AdamW with warm-up and cosine decay over `trained_parameters`, the step logs, export."""

    def setup_training(
        self, optim: DictConfig, image_key: str, tokenizer: str | None, reconstruct_prob: float
    ) -> None:
        if not 0.0 <= reconstruct_prob <= 1.0:
            raise ValueError(f"reconstruct_prob must lie in [0, 1], got {reconstruct_prob}")
        if reconstruct_prob > 0 and tokenizer is None:
            raise ValueError("reconstruct_prob > 0 needs a tokenizer folder to make the round trips")
        self.tokenizer = frozen(VQModel.from_pretrained(tokenizer)) if tokenizer else None
        self.reconstruct_prob = reconstruct_prob
        self.optim_cfg = optim
        self.image_key = image_key  # training images; validation always reads the full-size "image"
        self.last_step_time: float | None = None

    def trained_parameters(self):
        return self.model.parameters()

    def configure_optimizers(self):
        optimizer = adamw(self.trained_parameters(), self.optim_cfg)
        schedule = warmup_cosine_schedule(optimizer, self.optim_cfg)
        return [optimizer], [{"scheduler": schedule, "interval": "step"}]

    @torch.no_grad()
    def round_trip(self, images: torch.Tensor) -> torch.Tensor:
        # float32 under bf16-mixed too: the ids of pre-tokenisation, and a result that fits the float32 batch
        with torch.autocast(device_type=images.device.type, enabled=False):
            return self.tokenizer.decode(self.tokenizer.encode(images.float())).clamp(-1, 1)

    def training_images(self, batch: dict) -> torch.Tensor:
        """The batch's training images, a random `reconstruct_prob` of them replaced by their round trips."""
        images = batch[self.image_key]
        if self.reconstruct_prob > 0:
            chosen = torch.rand(images.shape[0], device=images.device) < self.reconstruct_prob
            if chosen.any():
                images = images.clone()
                images[chosen] = self.round_trip(images[chosen])
        return images

    def log_step(self, logs: dict, total: torch.Tensor, batch: dict) -> None:
        """Log a training step's `logs` with its loss `total`, throughput and skipped samples."""
        size = batch[self.image_key].shape[0]
        logs["train/loss"] = total.detach()
        now = time.perf_counter()
        if self.last_step_time is not None:
            logs["train/samples_per_s"] = size / (now - self.last_step_time)
        self.last_step_time = now
        logs["train/skipped_samples"] = batch["skipped"].float() if "skipped" in batch else 0.0
        self.log_dict(logs, batch_size=size)
        self.log("loss", total.detach(), prog_bar=True, logger=False)

    def on_train_batch_start(self, batch, batch_idx) -> None:
        if batch_idx == 0:
            self.last_step_time = None  # do not count the pause for validation or a new epoch

    def export(self, folder: Path) -> Path:
        return self.model.save_pretrained(folder)


class SceneEvalLightning(RoundTripTraining):
    def __init__(
        self,
        net: DictConfig,
        loss: DictConfig,
        optim: DictConfig,
        image_key: str = "image",
        tokenizer: str | None = None,
        reconstruct_prob: float = 0.0,
    ):
        super().__init__()
        self.save_hyperparameters()
        net, loss, optim = config_node(net), config_node(loss), config_node(optim)
        self.model = SceneEval(SceneEvalConfig(**OmegaConf.to_container(net, resolve=True)))
        self.setup_training(optim, image_key, tokenizer, reconstruct_prob)
        self.loss_cfg = loss

    def losses(self, out: dict, attributes: list[dict]) -> dict[str, torch.Tensor]:
        counts, centroids, present = batch_targets(attributes, self.device)
        density = density_targets(attributes, self.model.grid).to(self.device)
        # summed over pairs and cells, averaged over images: an image's total squared error
        density_loss = (out["density"] - density).square().sum((1, 2, 3)).mean()
        # every scene has at least one object, so `present` is never empty
        centroid_loss = (out["centroids"] - centroids).square().sum(-1)[present].mean()
        count_error = (out["counts"].detach() - counts).abs().mean()
        return {"density": density_loss, "centroid": centroid_loss}, count_error

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        terms, count_error = self.losses(self.model(self.training_images(batch)), batch["attributes"])
        total = sum(self.loss_cfg[f"{name}_weight"] * value for name, value in terms.items())
        logs = {f"train/{name}_loss": value.detach() for name, value in terms.items()}
        logs["train/count_abs_error"] = count_error
        self.log_step(logs, total, batch)
        return total

    def on_validation_epoch_start(self) -> None:
        # passed and total checks per kind, then summed prompt scores, summed round-trip prompt scores and
        # images; summed over ranks at the end
        self.val_sums = torch.zeros(2 * len(CHECK_KINDS) + 3, dtype=torch.float64, device=self.device)

    def prompt_scores(self, images: torch.Tensor, captions: list[str], sums: torch.Tensor | None = None):
        """Summed per-prompt scores of `images`; per-kind check tallies are added to `sums` when given."""
        counts, centroids = self.model.predict(images)
        total = 0.0
        for checks in check_results(counts, centroids, captions):
            if sums is not None:
                for check, passed in checks:
                    k = CHECK_KINDS.index(check.kind)
                    sums[k] += passed
                    sums[len(CHECK_KINDS) + k] += 1
            total += sum(passed for _, passed in checks) / len(checks)
        return total

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        sums = torch.zeros_like(self.val_sums)
        sums[-3] += self.prompt_scores(batch["image"], batch["caption"], sums)
        if self.tokenizer is not None:
            sums[-2] += self.prompt_scores(self.round_trip(batch["image"]), batch["caption"])
        sums[-1] += len(batch["caption"])
        self.val_sums += sums

    def on_validation_epoch_end(self) -> None:
        sums = self.all_gather(self.val_sums).reshape(-1, self.val_sums.numel()).sum(0)
        n = len(CHECK_KINDS)
        for k, kind in enumerate(CHECK_KINDS):
            if sums[n + k] > 0:  # a small validation set may hold no relation
                self.log(f"val/acc_{kind}", (sums[k] / sums[n + k]).float())
        self.log("val/score", (sums[-3] / sums[-1].clamp_min(1)).float(), prog_bar=True)
        if self.tokenizer is not None:
            self.log("val/score_vq", (sums[-2] / sums[-1].clamp_min(1)).float())


class SceneEvalBackgroundLightning(RoundTripTraining):
    def __init__(
        self,
        init_from: str,
        net: DictConfig,
        loss: DictConfig,
        optim: DictConfig,
        image_key: str = "image",
        tokenizer: str | None = None,
        reconstruct_prob: float = 0.0,
    ):
        super().__init__()
        self.save_hyperparameters()
        net, loss, optim = config_node(net), config_node(loss), config_node(optim)
        with torch.random.fork_rng():  # the run's draws do not depend on what init_from holds
            trained = SceneEval.from_pretrained(init_from)
        config = dataclasses.replace(trained.config, background_channels=int(net.background_channels))
        if not config.background_channels:
            raise ValueError("net.background_channels must be > 0: the width of the head to train")
        self.model = SceneEval(config)
        # the trunk as trained; the head keeps its fresh initialisation (a head in init_from is replaced)
        self.model.load_state_dict(self.model.state_dict() | trained.trunk_state_dict())
        self.model.requires_grad_(False)
        self.model.background_head.requires_grad_(True)
        self.setup_training(optim, image_key, tokenizer, reconstruct_prob)
        self.label_smoothing = float(loss.label_smoothing)
        self.train()  # Lightning keeps the modes a module has: the trunk's eval mode starts here

    def trained_parameters(self):
        return self.model.background_head.parameters()

    def train(self, mode: bool = True):
        # only the head trains: the trunk's BatchNorm layers keep their statistics (eval mode) at every step
        super().train(mode)
        self.model.eval()
        self.model.background_head.train(mode)
        return self

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        logits = self.model.background_logits(self.training_images(batch))
        kinds = background_targets(batch["attributes"], self.device)
        total = F.cross_entropy(logits, kinds, label_smoothing=self.label_smoothing)
        accuracy = (logits.detach().argmax(1) == kinds).float().mean()
        self.log_step({"train/background_acc": accuracy}, total, batch)
        return total

    def on_validation_epoch_start(self) -> None:
        # per kind: correct on the real images, correct on their round trips, images; summed over ranks
        self.val_sums = torch.zeros(3, len(BACKGROUNDS), dtype=torch.float64, device=self.device)

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        kinds = background_targets(batch["attributes"], self.device)
        tallies = [self.model.predict_background(batch["image"]) == kinds]
        if self.tokenizer is not None:
            tallies.append(self.model.predict_background(self.round_trip(batch["image"])) == kinds)
        for row, correct in enumerate(tallies):
            self.val_sums[row].index_add_(0, kinds, correct.double())
        self.val_sums[2].index_add_(0, kinds, torch.ones_like(kinds, dtype=torch.float64))

    def on_validation_epoch_end(self) -> None:
        sums = self.all_gather(self.val_sums).reshape(-1, *self.val_sums.shape).sum(0)
        images = sums[2].sum().clamp_min(1)
        self.log("val/background_acc", (sums[0].sum() / images).float(), prog_bar=True)
        for k, kind in enumerate(BACKGROUNDS):
            if sums[2, k] > 0:  # a small validation set may miss a kind
                self.log(f"val/background_acc_{kind}", (sums[0, k] / sums[2, k]).float())
        if self.tokenizer is not None:
            self.log("val/background_acc_vq", (sums[1].sum() / images).float())
