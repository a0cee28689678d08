"""Checkpoints that load with `torch.load(weights_only=True)`, so that resuming from one cannot run code.

Lightning stores each module's `save_hyperparameters()` in its checkpoints; ours are Hydra config nodes, which
weights-only loading refuses. `PlainContainers` writes them as plain dicts and lists, `config_node` turns
them back into config nodes when `load_from_checkpoint` hands them to a module, and `weights_only_loading`
checks a file before `mulo_sd.training.train.run` resumes from it (a truncated one is refused there too).
(RandomStateCheckpoint in training/callbacks.py keeps the NumPy RNG state as a tensor for the same reason.)
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path

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
    (a checkpoint of an older mulo-sd, or of other code) is an error that names the opt-in. Either way a file
    that is no readable checkpoint (truncated by a copy or a save that did not finish) is an error naming it
    and the readable checkpoints beside it, before anything runs."""
    if not ckpt_path or not os.path.isfile(ckpt_path):  # Lightning's own error, or its "last" / "hpc" lookup
        return not trust
    error = read_error(ckpt_path)
    if error:
        raise ValueError(unreadable_message(ckpt_path, error))
    if trust:
        return False
    try:  # the authority: torch's static list of globals misses objects built while unpickling
        torch.load(ckpt_path, map_location="cpu", weights_only=True, mmap=True)  # mmap: no tensor is read
    except pickle.UnpicklingError:
        unsafe = sorted(torch.serialization.get_unsafe_globals_in_checkpoint(ckpt_path))
        what = f" ({', '.join(unsafe)})" if unsafe else ""
        raise ValueError(
            f"ckpt_path={ckpt_path}: the file holds pickled Python objects{what}, which could run code "
            "when loaded, so it is not loaded (torch.load(weights_only=True)). Checkpoints written by "
            "this version hold only tensors and plain containers. If you trust the file (e.g. your own "
            "checkpoint of an older version), pass trust_checkpoint=true."
        ) from None
    except RuntimeError as err:  # an index that reads, records that do not
        raise ValueError(unreadable_message(ckpt_path, first_sentence(err))) from None
    return True


def first_sentence(err: Exception) -> str:
    return str(err).split(". ", 1)[0]  # torch's reader errors go on with generic advice


def read_error(path: str | os.PathLike) -> str | None:
    """Why `path` is no readable checkpoint, or None. Reads its zip index and pickled structure, without
    running the pickle or reading a tensor."""
    try:
        torch.serialization.get_unsafe_globals_in_checkpoint(path)
    except Exception as err:  # the zip reader's RuntimeError, ValueError for a file that is no zip, ...
        return first_sentence(err)
    return None


def unreadable_message(ckpt_path: str, error: str) -> str:
    path = Path(ckpt_path)
    others = [p.name for p in sorted(path.parent.glob("*.ckpt")) if p.name != path.name and not read_error(p)]
    return (
        f"ckpt_path={ckpt_path}: not a readable checkpoint ({path.stat().st_size} bytes; {error}): it is "
        "truncated or corrupt, e.g. a copy or a save that did not finish. Readable checkpoints beside it in "
        f"{path.parent}: {', '.join(others) or 'none'}."
    )
