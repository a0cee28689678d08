"""The W&B run id travels with the checkpoint: `WandbRunId` writes it into every checkpoint, and
`continue_wandb_run` gives a resumed run (`ckpt_path=...` with `logger=wandb`) the same id, so it logs into
the same W&B run (`resume: allow`) without the user passing `logger.wandb.id`; an explicit id still wins.

The logger exists before Lightning loads the checkpoint, so the id is read from the file beforehand."""

from __future__ import annotations

import logging
import os

import lightning as L
import torch
from lightning.pytorch.loggers import WandbLogger
from omegaconf import DictConfig, OmegaConf

log = logging.getLogger(__name__)

RUN_ID_KEY = "wandb_run_id"
WANDB_LOGGER = "lightning.pytorch.loggers.WandbLogger"


class WandbRunId(L.Callback):
    """Saves the id of the trainer's W&B run in each checkpoint (top-level key `wandb_run_id`)."""

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        for logger in trainer.loggers:
            # version: the run's id on the rank that writes checkpoints, without starting a run elsewhere
            if isinstance(logger, WandbLogger) and isinstance(logger.version, str):
                checkpoint[RUN_ID_KEY] = logger.version


def checkpoint_wandb_run_id(ckpt_path: str, weights_only: bool = True) -> str | None:
    """The W&B run id saved in a checkpoint (None when it was written without a W&B logger). Memory-mapped:
    the weights are not read. `weights_only`: as `train.run` loads the file (training/checkpoints.py)."""
    checkpoint = torch.load(ckpt_path, map_location="cpu", weights_only=weights_only, mmap=True)
    return checkpoint.get(RUN_ID_KEY)


def continue_wandb_run(
    logger_cfg: DictConfig | None, ckpt_path: str | None, weights_only: bool = True
) -> DictConfig | None:
    """`logger_cfg` with the checkpoint's W&B run id filled into each W&B logger that names none."""
    if not logger_cfg or not ckpt_path or not os.path.isfile(ckpt_path):  # else Lightning's "last" / "hpc"
        return logger_cfg
    wandb = {
        name: entry for name, entry in logger_cfg.items() if entry and entry.get("_target_") == WANDB_LOGGER
    }
    unnamed = [name for name, entry in wandb.items() if not entry.get("id") and not entry.get("version")]
    if not unnamed:
        return logger_cfg
    run_id = checkpoint_wandb_run_id(ckpt_path, weights_only)
    if run_id is None:
        log.warning("%s holds no W&B run id: the resumed run starts a new W&B run", ckpt_path)
        return logger_cfg
    # a resolved copy (its interpolations name the root config): the caller's config stays as it was
    logger_cfg = OmegaConf.create(OmegaConf.to_container(logger_cfg, resolve=True))
    for name in unnamed:
        logger_cfg[name].id = run_id
    log.info("continuing W&B run %s of %s", run_id, ckpt_path)
    return logger_cfg
