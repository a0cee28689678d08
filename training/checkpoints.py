"""Checkpoints that load with `torch.load(weights_only=True)`, so that resuming from one cannot run code.

Lightning stores each module's `save_hyperparameters()` in its checkpoints; ours are Hydra config nodes, which
weights-only loading refuses. `PlainContainers` writes them as plain dicts and lists, `config_node` turns
them back into config nodes when `load_from_checkpoint` hands them to a module, and `weights_only_loading`
checks a file before `mulo_sd.training.train.run` resumes from it. (RandomStateCheckpoint in
training/callbacks.py keeps the NumPy RNG state as a tensor for the same reason.)
"""

from __future__ import annotations

import os
import pickle
import re

import lightning as L
import torch
from lightning.fabric.utilities.apply_func import apply_to_collection
from omegaconf import Container, OmegaConf


class PlainContainers(L.Callback):
    """Writes the OmegaConf containers of each checkpoint (the modules' hyperparameters) as plain, resolved
    dicts and lists."""

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        checkpoint.update(apply_to_collection(checkpoint, Container, OmegaConf.to_container, resolve=True))


def config_node(value):
    """A module's config argument as an OmegaConf node: Hydra passes nodes, `load_from_checkpoint` the plain
    dicts and lists that checkpoints hold (`PlainContainers`). Nodes pass unchanged: a copy would lose the
    interpolations into the rest of the config (`${trainer.max_steps}`)."""
    return OmegaConf.create(value) if isinstance(value, dict | list) else value


def weights_only_loading(ckpt_path: str | None, trust: bool) -> bool:
    """The `weights_only` with which Lightning loads `ckpt_path`: False when the user trusts the file
    (`trust_checkpoint`), else True, after checking that the file loads so: one that pickles Python objects
    (a checkpoint of an older mulo-sd, or of other code) is an error that names the opt-in."""
    if trust:
        return False
    if ckpt_path and os.path.isfile(ckpt_path):  # else Lightning's own error, or its "last" / "hpc" lookup
        try:  # mmap: reads the pickled structure, not the tensors
            torch.load(ckpt_path, map_location="cpu", weights_only=True, mmap=True)
        except pickle.UnpicklingError as err:
            found = re.search(r"GLOBAL (\S+)", str(err))
            what = f" ({found.group(1)})" if found else ""
            raise ValueError(
                f"ckpt_path={ckpt_path}: the file holds pickled Python objects{what}, which could run code "
                "when loaded, so it is not loaded (torch.load(weights_only=True)). Checkpoints written by "
                "this version hold only tensors and plain containers. If you trust the file (e.g. your own "
                "checkpoint of an older version), pass trust_checkpoint=true."
            ) from None
    return True
