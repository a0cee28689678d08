"""The testbed's trained models: one folder per model under `TESTBED_DIR` (config.json + model.safetensors),
each written by `mulo-train experiment=testbed/<name> export=<folder>/<name>`. The loading and the checks
are those of any model set (mulo_sd/pipeline/model_set.py); this module reads a folder in the testbed layout.

    models = load_models()                                   # every model that exists
    models = load_models(names=["vq", "target"])            # just these; a missing one is an error
    models.require("drafter_r2")                             # a loaded model, or the command that makes it
"""

from __future__ import annotations

from pathlib import Path

import torch

from mulo_sd.pipeline.folder_hints import train_command
from mulo_sd.pipeline.model_set import Models, ModelSet, load_model_set
from mulo_sd.pipeline.roles import DRAFTERS, MODEL_CLASSES, SAMPLERS, TESTBED_DIR

__all__ = [
    "DRAFTERS", "MODEL_CLASSES", "SAMPLERS", "TESTBED_DIR", "Models", "available", "image_size",
    "load_models", "train_command",
]  # fmt: skip


def available(folder: str | Path = TESTBED_DIR) -> list[str]:
    """Names of the testbed models that have a folder with a config in `folder`."""
    return ModelSet.layout(folder).available()


def load_models(
    folder: str | Path = TESTBED_DIR, device: str | torch.device = "cpu", names: list[str] | None = None
) -> Models:
    """Load the testbed models in `folder` onto `device`. `names=None` loads every model that exists there;
    a list loads exactly those and raises FileNotFoundError (naming the `mulo-train` command) for a missing
    one. The models are checked against each other first (set_checks.check_configs)."""
    return load_model_set(ModelSet.layout(folder), names, device)


def image_size(models: Models) -> int:
    """Side in pixels of the target's images (target grid times the tokenizer's downsample factor)."""
    height, width = models.require("target").grid_size
    if height != width:
        raise ValueError(f"image_size needs a square target grid; the target grid is {height}x{width}")
    return height * models.require("vq").downsample_factor
