"""Reading the checkpoint files LlamaGen and Tar AR-DTok release or train (`.pt`, `.pth`), safely.

File layouts:
- LlamaGen (FoundationVision/LlamaGen): `torch.save({"model": state_dict, ...})`. Its training scripts add
  "optimizer", "steps", "args" (the script's argparse.Namespace) and, with `--ema`, "ema"; the VQ trainer also
  "discriminator" and "optimizer_disc". DeepSpeed and Lightning files keep the weights under "module" and
  "state_dict"; a bare state dict is read too.
- Tar AR-DTok: `{"model": {"name": "llama-abs-LP", "args": {...}, "sd": state_dict}}` (a `models.make`
  spec).

Unpickling: `torch.load(weights_only=True)` with exactly one class allowed beyond tensors and plain
containers, `argparse.Namespace` (LlamaGen's "args"), so loading a file cannot run code from it. A file that
needs any other class is refused with those classes named; `trust_pickle=True` (`mulo-convert --trust-pickle`)
unpickles it fully, for files from a source the user trusts (mulo_sd/nets/safe_files.py).

The family of a file (`FAMILIES`) is read off the key names of its weights, so a file given to the loader of
another family is refused before any model is built.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from mulo_sd.nets.safe_files import UnreadableTorchFile, UnsafePickleError, load_torch_file

FAMILIES = {
    "llamagen-vq": "a LlamaGen VQ tokenizer",
    "llamagen-gpt": "a LlamaGen GPT (t2i or c2i)",
    "tar-ar-dtok": "a Tar AR-DTok GPT",
}
CONVERT_COMMANDS = {family: f"mulo-convert {family}" for family in FAMILIES}
WEIGHT_SETS = ("model", "ema")
SAFE_GLOBALS = [argparse.Namespace]  # LlamaGen pickles its training args; nothing else is let through
TRUST_OPT_IN = "--trust-pickle (mulo-convert) or trust_pickle=True"
# Where "model" weights sit, in LlamaGen's sample scripts' order (DDP, DeepSpeed, Lightning)
MODEL_KEYS = ("model", "module", "state_dict")


class OfficialCheckpointError(ValueError):
    """An official checkpoint file is unreadable, unsafe to unpickle, of another family or lacks a setting."""


@dataclass
class OfficialCheckpoint:
    path: Path
    family: str  # a key of FAMILIES
    settings: dict[str, Any]  # the training settings stored in the file (LlamaGen "args", Tar spec "args")
    model_name: str | None  # Tar's spec name (e.g. "llama-abs-LP"); None for LlamaGen files
    weight_sets: dict[str, dict[str, torch.Tensor]] = field(repr=False)  # "model" and, if saved, "ema"

    def weights(self, which: str = "model") -> dict[str, torch.Tensor]:
        """The state dict of one weight set: "model" (what LlamaGen's sample scripts load) or "ema"."""
        if which not in WEIGHT_SETS:
            raise OfficialCheckpointError(f"weights must be one of {WEIGHT_SETS}, got {which!r}")
        if which not in self.weight_sets:
            raise OfficialCheckpointError(
                f"{self.path} has no {which!r} weights; it holds {sorted(self.weight_sets)} "
                f"(choose with --weights / weights=)"
            )
        return self.weight_sets[which]

    def expect(self, *families: str) -> None:
        """Raise unless the file is of one of `families`, naming what it is and the command for it."""
        if self.family in families:
            return
        wanted = " or ".join(FAMILIES[f] for f in families)
        raise OfficialCheckpointError(
            f"{self.path} holds {FAMILIES[self.family]} (read off its weight names), not {wanted}; "
            f"convert it with `{CONVERT_COMMANDS[self.family]}`"
        )


def read_official(
    path: str | Path, *, trust_pickle: bool = False, missing_hint: str = ""
) -> OfficialCheckpoint:
    """Read an official checkpoint file: its weight sets, its stored settings and its family.

    missing_hint: appended to the error when the file does not exist (where to get it)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found{': ' + missing_hint if missing_hint else ''}")
    checkpoint = _load(path, trust_pickle)
    if not isinstance(checkpoint, dict):
        raise OfficialCheckpointError(f"{path} holds a {type(checkpoint).__name__}, not a checkpoint dict")
    spec = checkpoint.get("model")
    if isinstance(spec, dict) and isinstance(spec.get("sd"), dict):  # Tar: models.make spec
        weight_sets = {"model": spec["sd"]}
        settings, name = _settings(spec.get("args")), spec.get("name")
    else:
        weight_sets = _llamagen_weight_sets(checkpoint)
        settings, name = _settings(checkpoint.get("args")), None
    if not weight_sets:
        raise OfficialCheckpointError(
            f"{path}: no weights under {list(MODEL_KEYS) + ['ema']} and not a bare state dict "
            f"(top-level keys: {sorted(map(str, checkpoint))[:8]})"
        )
    family = detect_family(next(iter(weight_sets.values())), name)
    if family is None:
        keys = sorted(next(iter(weight_sets.values())))[:8]
        raise OfficialCheckpointError(
            f"{path} is not a LlamaGen VQ, LlamaGen GPT or Tar AR-DTok checkpoint (weight names: {keys} ...)"
        )
    return OfficialCheckpoint(path, family, settings, name, weight_sets)


def detect_family(state: dict[str, torch.Tensor], model_name: str | None = None) -> str | None:
    """The family of a state dict by its key names; None when it is none of them."""
    if "quantize.embedding.weight" in state and "encoder.conv_in.weight" in state:
        return "llamagen-vq"
    if "tok_embeddings.weight" not in state:
        return None
    if "clip_proj.weight" in state or "abs_pe" in state or model_name is not None:
        return "tar-ar-dtok"
    if "cls_embedding.cap_proj.fc1.weight" in state or "cls_embedding.embedding_table.weight" in state:
        return "llamagen-gpt"
    return None


def _llamagen_weight_sets(checkpoint: dict) -> dict[str, dict[str, torch.Tensor]]:
    sets = {}
    model = next((checkpoint[k] for k in MODEL_KEYS if _is_state(checkpoint.get(k))), None)
    if model is None and _is_state(checkpoint):
        model = checkpoint  # a bare state dict
    if model is not None:
        sets["model"] = model
    if _is_state(checkpoint.get("ema")):
        sets["ema"] = checkpoint["ema"]
    return sets


def _settings(args) -> dict[str, Any]:
    if isinstance(args, argparse.Namespace):
        return dict(vars(args))
    return dict(args) if isinstance(args, dict) else {}


def _is_state(value) -> bool:
    return (
        isinstance(value, dict) and bool(value) and all(isinstance(v, torch.Tensor) for v in value.values())
    )


def _load(path: Path, trust_pickle: bool):
    try:
        return load_torch_file(path, opt_in=TRUST_OPT_IN, trust_pickle=trust_pickle, allowed=SAFE_GLOBALS)
    except (UnsafePickleError, UnreadableTorchFile) as error:
        raise OfficialCheckpointError(str(error)) from None
