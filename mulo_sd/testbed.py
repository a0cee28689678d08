"""The testbed's trained models: one folder per model under `TESTBED_DIR` (config.json + model.safetensors),
each written by `mulo-train experiment=testbed/<name> export=<folder>/<name>`.

    models = load_models()                                   # every model that exists
    models = load_models(names=["vq", "target"])            # just these; a missing one is an error
    models.require("drafter_r2")                             # a loaded model, or the command that makes it
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from mulo_sd.downsampler import Downsampler
from mulo_sd.gpt import GPT
from mulo_sd.io import CONFIG_NAME
from mulo_sd.sceneeval import SceneEval
from mulo_sd.upsampler import Upsampler
from mulo_sd.vq import VQModel

TESTBED_DIR = Path(__file__).resolve().parent / "assets" / "testbed"

# folder name -> model class; the drafters and samplers are kept by these names in `Models`
MODEL_CLASSES = {
    "vq": VQModel,
    "target": GPT,
    "drafter_r2": GPT,
    "drafter_r4": GPT,
    "drafter_small": GPT,
    "upsampler_r2": Upsampler,
    "upsampler_r4": Upsampler,
    "downsampler_r2": Downsampler,
    "downsampler_r4": Downsampler,
    "sceneeval": SceneEval,
}
DRAFTERS = ("drafter_r2", "drafter_r4", "drafter_small")
SAMPLERS = ("upsampler_r2", "upsampler_r4", "downsampler_r2", "downsampler_r4")


def train_command(name: str, folder: str | Path = TESTBED_DIR) -> str:
    """The command that trains and exports testbed model `name` into `folder`/`name`."""
    path = Path(folder).resolve() / name
    try:
        path = path.relative_to(Path.cwd())
    except ValueError:
        pass  # outside the working directory: keep it absolute
    return f"mulo-train experiment=testbed/{name} export={path}"


def available(folder: str | Path = TESTBED_DIR) -> list[str]:
    """Names of the testbed models that have a folder with a config in `folder`."""
    return [name for name in MODEL_CLASSES if (Path(folder) / name / CONFIG_NAME).is_file()]


@dataclass
class Models:
    """The loaded testbed models; any of them may be absent (None / not in the dicts)."""

    folder: Path = TESTBED_DIR
    tokenizer: VQModel | None = None
    target: GPT | None = None
    drafters: dict[str, GPT] = field(default_factory=dict)  # by folder name: drafter_r2, drafter_r4, ...
    samplers: dict[str, torch.nn.Module] = field(default_factory=dict)  # upsampler_r2, downsampler_r4, ...
    sceneeval: SceneEval | None = None

    def get(self, name: str):
        """The model loaded from folder `name`, or None."""
        if name not in MODEL_CLASSES:
            raise ValueError(f"unknown testbed model '{name}'; known: {list(MODEL_CLASSES)}")
        if name == "vq":
            return self.tokenizer
        if name in ("target", "sceneeval"):
            return getattr(self, name)
        return {**self.drafters, **self.samplers}.get(name)

    def require(self, name: str):
        """The model loaded from folder `name`; if absent, a FileNotFoundError naming the command that
        makes it."""
        model = self.get(name)
        if model is None:
            raise FileNotFoundError(missing_message(name, self.folder))
        return model


def missing_message(name: str, folder: str | Path) -> str:
    return (
        f"testbed model '{name}' not found in {Path(folder) / name}: train and export it with\n"
        f"    {train_command(name, folder)}"
    )


def load_models(
    folder: str | Path = TESTBED_DIR, device: str | torch.device = "cpu", names: list[str] | None = None
) -> Models:
    """Load the testbed models in `folder` onto `device`. `names=None` loads every model that exists there;
    a list loads exactly those and raises FileNotFoundError (naming the `mulo-train` command) for a missing
    one. Samplers and GPTs are checked against the tokenizer when it is loaded too."""
    folder = Path(folder)
    if names is None:
        names = available(folder)
    unknown = sorted(set(names) - set(MODEL_CLASSES))
    if unknown:
        raise ValueError(f"unknown testbed model(s) {unknown}; known: {list(MODEL_CLASSES)}")
    models = Models(folder=folder)
    for name in names:
        if not (folder / name / CONFIG_NAME).is_file():
            raise FileNotFoundError(missing_message(name, folder))
        model = MODEL_CLASSES[name].from_pretrained(folder / name, device)
        if name == "vq":
            models.tokenizer = model
        elif name in ("target", "sceneeval"):
            setattr(models, name, model)
        elif name in DRAFTERS:
            models.drafters[name] = model
        else:
            models.samplers[name] = model
    if models.tokenizer is not None:
        check_tokenizer(models)
    return models


def check_tokenizer(models: Models) -> None:
    """Raise unless every loaded GPT and sampler works on the tokenizer's codebook."""
    vq = models.tokenizer
    gpts = {"target": models.target, **models.drafters}
    for name, gpt in gpts.items():
        if gpt is not None and gpt.vocab_size != vq.codebook_size:
            raise ValueError(
                f"{name} predicts {gpt.vocab_size} token ids but the tokenizer has {vq.codebook_size} "
                f"entries: retrain it on tokens of this tokenizer ({train_command(name, models.folder)})"
            )
    for sampler in models.samplers.values():
        sampler.check_tokenizer(vq)


def image_size(models: Models) -> int:
    """Side in pixels of the target's images (target grid times the tokenizer's downsample factor)."""
    height, width = models.require("target").grid_size
    if height != width:
        raise ValueError(f"the testbed renders square scenes; the target grid is {height}x{width}")
    return height * models.require("vq").downsample_factor
