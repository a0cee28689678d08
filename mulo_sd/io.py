"""Models saved as a folder: `config.json` (the dataclass config plus a `kind` tag) and `model.safetensors`.

Every model of the runtime (tokenizer, GPT, samplers, SceneEval) inherits `Pretrained`, so a checkpoint
exported by training loads with one call: `Cls.from_pretrained(folder)`.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"


class Pretrained:
    """Mixin for `nn.Module`s whose constructor takes one dataclass config stored as `self.config`."""

    kind: str  # tag written to config.json so a folder of another model type is refused clearly
    config_class: type

    def save_pretrained(self, folder: str | Path, dtype: torch.dtype | None = None) -> Path:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        config = {"kind": self.kind, **dataclasses.asdict(self.config)}
        (folder / CONFIG_NAME).write_text(json.dumps(config, indent=2) + "\n")
        state = {}
        for name, tensor in self.state_dict().items():
            tensor = tensor.detach().cpu()
            if dtype is not None and tensor.is_floating_point():
                tensor = tensor.to(dtype)
            state[name] = tensor.clone().contiguous()  # clone: tied weights must not share storage
        save_file(state, str(folder / WEIGHTS_NAME))
        return folder

    @classmethod
    def load_config(cls, folder: str | Path):
        path = Path(folder) / CONFIG_NAME
        if not path.is_file():
            raise FileNotFoundError(
                f"{path} not found: a {cls.kind} model folder holds {CONFIG_NAME} and {WEIGHTS_NAME} "
                f"(written by `save_pretrained` or by `mulo-train ... export=FOLDER`)"
            )
        raw = json.loads(path.read_text())
        kind = raw.pop("kind", None)
        if kind != cls.kind:
            raise ValueError(f"{folder} holds a '{kind}' model, not a '{cls.kind}' model")
        names = {f.name for f in dataclasses.fields(cls.config_class)}
        unknown = sorted(set(raw) - names)
        if unknown:
            raise ValueError(f"{path}: unknown {cls.config_class.__name__} fields {unknown}")
        return cls.config_class(**raw)

    @classmethod
    def from_pretrained(cls, folder: str | Path, device: str | torch.device = "cpu"):
        model = cls(cls.load_config(folder))
        weights = Path(folder) / WEIGHTS_NAME
        if not weights.is_file():
            raise FileNotFoundError(f"{weights} not found beside {CONFIG_NAME}")
        state = load_file(str(weights))
        dtypes = {k: v.dtype for k, v in model.state_dict().items()}
        state = {k: v.to(dtypes[k]) if k in dtypes else v for k, v in state.items()}
        missing, unexpected = model.load_state_dict(state, strict=False)
        if missing or unexpected:
            raise ValueError(
                f"{weights} does not match {cls.__name__}({folder}/{CONFIG_NAME}): "
                f"missing {missing[:8]}, unexpected {unexpected[:8]}"
            )
        return model.to(device).eval()
