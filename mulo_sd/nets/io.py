"""Models saved as a folder: `config.json` (the dataclass config plus a `kind` tag) and `model.safetensors`
(the weights, with the same config stored in the file's metadata under `CONFIG_KEY`).

Every model of the runtime (tokenizer, GPT, samplers, SceneEval) inherits `Pretrained`, so a checkpoint
exported by training loads with one call: `Cls.from_pretrained(folder)`. Loading checks the folder and
raises `ModelFileError` naming the file and the field:
- config.json: valid JSON, the model's `kind`, known fields, every required field, values of the right type
  (model_config.py), the config's own checks;
- model.safetensors: a readable, complete file; the config stored in it equals config.json field by field,
  which catches edits that change no weight shape (n_head, grid_size, image_size); files saved without it
  get the shape checks only;
- every tensor present with the shape config.json implies, and none extra; a mismatch names the config
  fields that set that tensor's shape.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from mulo_sd.nets.model_config import ModelFileError, config_dict, config_from_dict, read_json

__all__ = ["CONFIG_KEY", "CONFIG_NAME", "WEIGHTS_NAME", "ModelFileError", "Pretrained"]

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
CONFIG_KEY = "mulo_sd.config"  # safetensors metadata: the config.json the weights were saved with
MAX_LISTED = 8  # mismatching tensors named in one error


class Pretrained:
    """Mixin for `nn.Module`s whose constructor takes one dataclass config stored as `self.config`."""

    kind: str  # tag written to config.json so a folder of another model type is refused clearly
    config_class: type

    def save_pretrained(self, folder: str | Path, dtype: torch.dtype | None = None) -> Path:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        config = config_dict(self.config, self.kind)
        (folder / CONFIG_NAME).write_text(json.dumps(config, indent=2) + "\n")
        state = {}
        for name, tensor in self.state_dict().items():
            tensor = tensor.detach().cpu()
            if dtype is not None and tensor.is_floating_point():
                tensor = tensor.to(dtype)
            state[name] = tensor.clone().contiguous()  # clone: tied weights must not share storage
        save_file(state, str(folder / WEIGHTS_NAME), metadata={CONFIG_KEY: json.dumps(config)})
        return folder

    @classmethod
    def load_config(cls, folder: str | Path):
        path = Path(folder) / CONFIG_NAME
        if not path.is_file():
            raise FileNotFoundError(
                f"{path} not found: a {cls.kind} model folder holds {CONFIG_NAME} and {WEIGHTS_NAME} "
                f"(written by `save_pretrained` or by `mulo-train ... export=FOLDER`)"
            )
        return config_from_dict(cls.config_class, cls.kind, read_json(path), str(path))

    @classmethod
    def from_pretrained(cls, folder: str | Path, device: str | torch.device = "cpu"):
        config = cls.load_config(folder)
        weights = Path(folder) / WEIGHTS_NAME
        if not weights.is_file():
            raise FileNotFoundError(f"{weights} not found beside {CONFIG_NAME}")
        state, metadata = read_weights(weights)
        if CONFIG_KEY in metadata:
            check_saved_config(cls, config, metadata[CONFIG_KEY], Path(folder) / CONFIG_NAME, weights)
        model = cls(config)
        check_tensors(cls, config, model.state_dict(), state, weights)
        dtypes = {k: v.dtype for k, v in model.state_dict().items()}
        model.load_state_dict({k: v.to(dtypes[k]) for k, v in state.items()})
        return model.to(device).eval()


def read_weights(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """(tensors, metadata) of a safetensors file; ModelFileError naming it if it is truncated or corrupt."""
    try:
        with safe_open(str(path), framework="pt") as file:
            return {name: file.get_tensor(name) for name in file.keys()}, file.metadata() or {}
    except SafetensorError as error:
        raise ModelFileError(
            f"{path}: not a complete safetensors file ({error}); it may be truncated or corrupt: "
            f"re-export the model"
        ) from None


def check_saved_config(cls, config, saved: str, config_path: Path, weights: Path) -> None:
    """Raise unless the config stored in the weights (JSON `saved`) equals config.json field by field."""
    source = f"{weights} (metadata '{CONFIG_KEY}')"
    try:
        raw = json.loads(saved)
    except json.JSONDecodeError as error:
        raise ModelFileError(f"{source}: invalid JSON ({error})") from None
    if not isinstance(raw, dict):
        raise ModelFileError(f"{source}: expected a JSON object, got {type(raw).__name__}")
    expected = dataclasses.asdict(config_from_dict(cls.config_class, cls.kind, raw, source))
    given = dataclasses.asdict(config)
    differ = [name for name in given if given[name] != expected[name]]
    if differ:
        values = "; ".join(
            f"{name} is {json.dumps(given[name])} in {CONFIG_NAME}, saved as {json.dumps(expected[name])}"
            for name in differ
        )
        raise ModelFileError(
            f"{config_path} does not match the config {weights} was saved with (field(s) {differ}: "
            f"{values}); restore the {CONFIG_NAME} exported with these weights"
        )


def check_tensors(cls, config, expected: dict[str, torch.Tensor], state: dict[str, torch.Tensor], weights):
    """Raise unless `state` (read from `weights`) holds exactly the tensors of `expected`, shape for shape,
    naming the config fields that set the shape of each mismatching tensor."""
    problems = {}
    for name in sorted(set(expected) | set(state)):
        if name not in state:
            problems[name] = f"missing from the file; the config implies shape {list(expected[name].shape)}"
        elif name not in expected:
            problems[name] = (
                f"in the file (shape {list(state[name].shape)}), but not in the model of the config"
            )
        elif state[name].shape != expected[name].shape:
            problems[name] = (
                f"shape {list(state[name].shape)} in the file, {list(expected[name].shape)} from the config"
            )
    if not problems:
        return
    listed = list(problems)[:MAX_LISTED]
    fields = fields_setting(cls, config, listed)
    lines = [
        f"  tensor '{name}': {problems[name]} (set by config field(s): {_names(fields[name])})"
        for name in listed
    ]
    if len(problems) > len(listed):
        lines.append(f"  ... and {len(problems) - len(listed)} more")
    config_path = Path(weights).parent / CONFIG_NAME
    raise ModelFileError(f"{weights} does not fit the {cls.__name__} of {config_path}:\n" + "\n".join(lines))


def fields_setting(cls, config, names: list[str]) -> dict[str, list[str]]:
    """Tensor name -> the config fields whose value changes that tensor's shape or presence, found by
    building the model on the meta device (no memory, no weights) with one field changed at a time. Fields
    that are strings, or whose changed values are invalid configs, are not probed."""
    reference = _tensor_shapes(cls, config)
    found: dict[str, list[str]] = {name: [] for name in names}
    for field in dataclasses.fields(config):
        for value in _variants(getattr(config, field.name)):
            try:
                shapes = _tensor_shapes(cls, dataclasses.replace(config, **{field.name: value}))
            except (ValueError, TypeError, ZeroDivisionError, RuntimeError):
                continue
            for name in names:
                if shapes.get(name) != reference.get(name) and field.name not in found[name]:
                    found[name].append(field.name)
    return found


def _names(fields: list[str]) -> str:
    return ", ".join(fields) if fields else "not known"


def _tensor_shapes(cls, config) -> dict[str, torch.Size]:
    with torch.device("meta"):
        return {name: tensor.shape for name, tensor in cls(config).state_dict().items()}


def _variants(value) -> list:
    """Other values of a config field, to probe what it shapes: larger, smaller, longer, shorter, flipped."""
    if isinstance(value, bool):
        return [not value]
    if isinstance(value, (int, float)):
        return [value * 2 or 1] + ([value // 2] if isinstance(value, int) and value > 1 else [])
    if value is None:
        return [1, 2]
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, int) for v in value):
        longer, shorter = [*value, value[-1]], list(value[:-1])
        return [type(value)(v * 2 for v in value), type(value)(longer), type(value)(shorter)]
    return []
