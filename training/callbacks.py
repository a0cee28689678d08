"""Callbacks shared by every training run."""

from __future__ import annotations

import random

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
