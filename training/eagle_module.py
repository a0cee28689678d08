"""LightningModule that trains an EAGLE draft head (mulo_sd/nets/eagle_head.py) for a frozen target GPT.

Data: pre-tokenised grids with captions (the target's own training shards). The frozen target computes its
final hidden features f_0..f_{N-1} on the fly (teacher-forced, `GPT.features`); the head reads
(e(x_p), f_p) for p < N-1 and predicts f_{p+1}. Loss, as EAGLE trains it: `feature_weight` * smooth-L1(f^, f)
+ `ce_weight` * cross-entropy of the draft distribution softmax(W f^) against the target's softmax(W f), W the
target's frozen output head. Classifier-free guidance drafts with both branches (docs/eagle2.md), so a share
`uncond_prob` of the rows runs the target on the dropped caption and trains the head on those features.

Validation: the same losses and `val/top1`, how often the head's most likely token is the target's, one
position ahead on the ground-truth prefix (the first link of a greedy draft chain).
"""

from __future__ import annotations

import lightning as L
import torch
import torch.nn.functional as F
from mulo_sd.training.ar_module import token_grid
from mulo_sd.training.caption_condition import CaptionCondition
from mulo_sd.training.checkpoints import config_node
from mulo_sd.training.frozen import frozen
from mulo_sd.training.optim import adamw_cosine, clip_by_norm
from omegaconf import DictConfig, OmegaConf

from mulo_sd.nets.eagle_head import EagleHead, EagleHeadConfig
from mulo_sd.nets.gpt import GPT


class EagleLightning(L.LightningModule):
    requires_captions = True  # the datamodule skips captionless samples (data.require_captions=null)

    def __init__(
        self,
        target: str,
        token_key: str,
        head: DictConfig,
        optim: DictConfig,
        loss: DictConfig,
        uncond_prob: float = 0.2,
        init_from: str | None = None,
    ):
        """target: the frozen target GPT folder. token_key: the batch's grid (tok16). head: EagleHeadConfig
        fields that differ from the target's (EagleHeadConfig.for_target). optim: lr, betas, weight_decay,
        warmup_steps, total_steps, min_lr_ratio, grad_clip. loss: feature_weight, ce_weight. uncond_prob:
        share of rows with the caption dropped (the unconditional branch of guidance). init_from: an EAGLE
        head folder whose weights start the training, e.g. a smaller grid's head (rotary positions hold no
        weights); a head of another width, vocabulary or layer shape is an error."""
        super().__init__()
        self.save_hyperparameters()
        head, optim, loss = (config_node(c) for c in (head, optim, loss))
        if not 0.0 <= uncond_prob <= 1.0:
            raise ValueError(f"uncond_prob must lie in [0, 1], got {uncond_prob}")
        self.target = frozen(GPT.from_pretrained(target))
        overrides = OmegaConf.to_container(head, resolve=True) if head is not None else {}
        self.head = EagleHead(EagleHeadConfig.for_target(self.target.config, **overrides))
        if init_from is not None:
            self.initialise_from(init_from)
        self.condition = CaptionCondition(self.target.config)
        self.token_key = token_key
        self.optim_cfg = optim
        self.loss_cfg = loss
        self.uncond_prob = uncond_prob
        self.val_sums = torch.zeros(4, dtype=torch.float64)  # feature loss, ce, top-1 hits, positions

    def initialise_from(self, folder: str) -> None:
        source = EagleHead.from_pretrained(folder)
        try:
            self.head.load_state_dict(source.state_dict())
        except RuntimeError as error:  # shape mismatches, missing or unexpected weights
            raise ValueError(f"init_from {folder} does not fit the configured EAGLE head: {error}") from None

    def configure_optimizers(self):
        return adamw_cosine(self.head.parameters(), self.optim_cfg)

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None):
        clip_by_norm(self, optimizer, self.optim_cfg.grad_clip)

    def losses(self, batch: dict, drop_prob: float) -> dict[str, torch.Tensor]:
        """Per-position feature loss, cross-entropy and top-1 agreement, each [B, N-1]."""
        grid = token_grid(batch, self.token_key, self.target.grid_size, "the target's grid is")
        tokens = grid.flatten(1)
        cond, cond_mask = self.condition(batch, grid.device)
        drop = torch.rand(tokens.shape[0], device=grid.device) < drop_prob
        with torch.no_grad():
            features = self.target.features(tokens, cond, cond_mask, drop=drop)  # f_0 .. f_{N-1}
            embeddings = self.target.tok_embeddings(tokens[:, :-1])
            target_probs = self.target.output(features[:, 1:]).float().softmax(-1)
        predicted = self.head(features[:, :-1], embeddings)  # f^_1 .. f^_{N-1}
        draft_logits = self.target.output(predicted).float()
        feature = F.smooth_l1_loss(predicted.float(), features[:, 1:].float(), reduction="none")
        return {
            "feature": feature.mean(-1),
            "ce": -(target_probs * draft_logits.log_softmax(-1)).sum(-1),
            "top1": (draft_logits.argmax(-1) == target_probs.argmax(-1)).float(),
        }

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        parts = self.losses(batch, self.uncond_prob)
        feature, ce = parts["feature"].mean(), parts["ce"].mean()
        loss = self.loss_cfg.feature_weight * feature + self.loss_cfg.ce_weight * ce
        size = parts["ce"].shape[0]
        logs = {"train/loss": loss.detach(), "train/feature": feature.detach(), "train/ce": ce.detach()}
        self.log_dict({**logs, "train/top1": parts["top1"].mean()}, batch_size=size)
        self.log("loss", loss.detach(), prog_bar=True, logger=False, batch_size=size)
        return loss

    def on_validation_epoch_start(self) -> None:
        self.val_sums = torch.zeros(4, dtype=torch.float64, device=self.device)

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        parts = self.losses(batch, 0.0)  # conditional rows: the branch whose tokens guidance follows most
        sums = [parts[name].sum().double() for name in ("feature", "ce", "top1")]
        self.val_sums += torch.stack([*sums, torch.tensor(parts["ce"].numel()).to(sums[0])])

    def on_validation_epoch_end(self) -> None:
        feature, ce, top1, count = self.all_gather(self.val_sums).reshape(-1, 4).sum(0).tolist()
        loss = self.loss_cfg.feature_weight * feature / count + self.loss_cfg.ce_weight * ce / count
        self.log_dict(
            {"val/loss": loss, "val/feature": feature / count, "val/ce": ce / count, "val/top1": top1 / count}
        )

    def export(self, folder):
        return self.head.save_pretrained(folder)
