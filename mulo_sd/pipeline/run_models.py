"""A run's own model for a role (`folders: {upsampler_r2: <folder>}` in a run entry of `mulo-eval`): the
evaluation's models with that role's model swapped, e.g. the up-sampler ablation's samplers trained with
other losses, decoded side by side with the rest (docs/evaluation.md section 1).

Folders resolve like a model set's: relative ones under the set's root, absolute ones as they are. The
swapped folders are checked against the set's tokenizer and target the way `load_model_set` checks a set.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from mulo_sd.nets.io import CONFIG_NAME
from mulo_sd.pipeline.model_set import Models, load_model_set
from mulo_sd.pipeline.roles import DRAFTERS, SAMPLERS
from mulo_sd.pipeline.set_checks import check_configs

SWAPPABLE = (*DRAFTERS, "eagle_head", *SAMPLERS)


def check_folders(run: str, folders: dict, used: list[str]) -> None:
    """Raise unless every role of `folders` is a swappable role that run `run` decodes with (`used`)."""
    for role in folders:
        if role not in SWAPPABLE:
            raise ValueError(
                f"run '{run}': folders.{role}: only these roles can be swapped per run: {SWAPPABLE}"
            )
        if role not in used:
            raise ValueError(
                f"run '{run}': folders.{role}: the run does not decode with a {role} (it uses {used}); the "
                f"folder would be ignored"
            )


def with_folders(models: Models, folders: dict[str, str], run: str) -> Models:
    """`models` with each role of `folders` loaded from that folder instead; errors name the run and role."""
    base = models.model_set
    root = base.root or Path.cwd()
    paths = {role: root / str(folder) for role, folder in folders.items()}
    for role, path in paths.items():
        if not (path / CONFIG_NAME).is_file():
            raise FileNotFoundError(
                f"run '{run}': folders.{role}: no model in {path} ({CONFIG_NAME} not found)"
            )
    model_set = dataclasses.replace(
        base, name=f"{base.name} (run '{run}')", folders={**base.folders, **paths}
    )
    check_configs(model_set, {role: model_set.config(role) for role in (*paths, "vq", "target")}, None)
    swapped = load_model_set(model_set, list(paths), models.require("target").device)
    for role in paths:
        if role in SAMPLERS:
            try:
                swapped.get(role).check_tokenizer(models.require("vq"))
            except ValueError as error:
                raise ValueError(f"run '{run}': folders.{role} ({paths[role]}): {error}") from None
    return dataclasses.replace(
        models,
        drafters={**models.drafters, **swapped.drafters},
        samplers={**models.samplers, **swapped.samplers},
        model_set=model_set,
    )
