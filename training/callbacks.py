"""Callbacks shared by every training run."""

from __future__ import annotations

import random
from pathlib import Path

import lightning as L
import numpy as np
import torch


class RandomStateCheckpoint(L.Callback):
    """Saves the Python, NumPy and torch random states in each checkpoint and restores them on resume, so
    random choices after a resume (caption dropout, noise) are the ones the uninterrupted run made."""

    def state_dict(self) -> dict:
        name, keys, position, has_gauss, cached_gaussian = np.random.get_state()
        # numpy's key array as a tensor: checkpoints are read with torch.load(weights_only=True)
        numpy_state = (name, torch.from_numpy(keys.astype(np.int64)), position, has_gauss, cached_gaussian)
        state = {"python": random.getstate(), "numpy": numpy_state, "torch": torch.get_rng_state()}
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            state["cuda"] = torch.cuda.get_rng_state_all()
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        random.setstate(state_dict["python"])
        name, keys, position, has_gauss, cached_gaussian = state_dict["numpy"]
        keys = np.asarray(keys, dtype=np.int64).astype(np.uint32)
        np.random.set_state((name, keys, position, has_gauss, cached_gaussian))
        torch.set_rng_state(state_dict["torch"])
        if "cuda" in state_dict and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state_dict["cuda"])


class FinalStep(L.Callback):
    """Ends a run on its final weights when max_steps is not a multiple of the checkpoint or validation
    interval: writes last.ckpt of the final step (ModelCheckpoint's stays at the last interval, so a resume
    would silently redo the steps after it) and records the step last validated, which `train.run` compares
    with the final step to validate once more. A fit that takes no step (validation-only) is left alone."""

    def __init__(self):
        self.start_step: int | None = None
        self.validated_step: int | None = None

    def trained(self, trainer: L.Trainer) -> bool:
        """Whether the last fit took at least one step."""
        return self.start_step is not None and trainer.global_step > self.start_step

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.start_step = trainer.global_step  # after a resume: the checkpoint's step

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking:
            self.validated_step = trainer.global_step

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self.trained(trainer):
            return
        for callback in trainer.checkpoint_callbacks:
            # save_last="link": last.ckpt points at a step file, which writing through it would overwrite
            if callback.save_last is True and callback.dirpath:
                path = Path(callback.dirpath) / f"{callback.CHECKPOINT_NAME_LAST}.ckpt"
                # ModelCheckpoint's own on_train_end, after this one, writes last.ckpt when it saved nothing
                # in this fit: knowing the file as its own, it rewrites it rather than adding last-v1.ckpt
                callback.last_model_path = str(path)
                trainer.save_checkpoint(path)
