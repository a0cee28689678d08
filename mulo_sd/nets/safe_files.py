"""Torch pickle files (`torch.save`: `.pt`, `.pth`, `.bin`) read without running code stored in them.

`load_torch_file` unpickles with `torch.load(weights_only=True)`: tensors, plain containers and the classes a
caller lets through (`allowed`), nothing else. A file that needs more is refused with the classes and
functions its pickle names (`pickle_globals`, read without unpickling) and either the caller's opt-in to full
unpickling (for files from a source the user trusts) or how to re-save the file without them.

Folders in transformers' `save_pretrained` layout (T5, CLIP, Tar's MLLM) whose weights are
`pytorch_model*.bin` files: transformers reads those with weights_only=True too, so nothing runs, but its
refusal names neither the file's classes nor the fix; `check_pickled_weights` does, before anything loads.
"""

from __future__ import annotations

import io
import pickle
import re
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

PLAIN = "tensors and plain containers"
RESAVE = (
    "if you trust where it came from, load it once with torch.load(path, weights_only=False) and torch.save "
    f"only its {PLAIN} (dicts, lists, numbers, strings)"
)
# torch's weights_only refusal of a file it cannot scan (the legacy, non-zip format) names the first global
_REFUSED_GLOBAL = re.compile(r"GLOBAL ([\w.]+)")


class UnsafePickleError(ValueError):
    """A pickle that names classes or functions beyond the allowed ones: unpickling it could run code."""


class UnreadableTorchFile(ValueError):
    """Not a file torch.load reads: damaged, truncated, or not a torch.save file."""


def pickle_globals(path: str | Path, allowed: Sequence[type] = ()) -> list[str]:
    """The classes and functions the pickle of a torch.save file at `path` names beyond torch's weights_only
    allowlist and `allowed`, read statically (nothing is unpickled); [] when the file cannot be scanned (the
    legacy format, TorchScript, a damaged file)."""
    names = {f"{g.__module__}.{g.__qualname__}" for g in allowed}
    try:
        found = torch.serialization.get_unsafe_globals_in_checkpoint(path)
    except Exception:  # not scannable: the caller's weights_only load decides
        return []
    return sorted(set(found) - names)


def load_torch_file(
    path: str | Path,
    *,
    opt_in: str | None = None,
    trust_pickle: bool = False,
    allowed: Sequence[type] = (),
    map_location: str | torch.device = "cpu",
    mmap: bool = False,
    data: bytes | None = None,
) -> Any:
    """torch.load of `path` with weights_only=True (the classes in `allowed` let through too), or fully with
    `trust_pickle`. opt_in: how the user asks for full unpickling (e.g. "fid.trust_pickle=true"), named in
    the refusal; None: there is none, the refusal says how to re-save the file. mmap: memory-mapped (no tensor
    data read until used), read plainly where the legacy format cannot be mapped. data: the file's bytes,
    when the caller has read them (so that what was checked is what it goes on to use).

    Raises UnsafePickleError naming the file, the classes its pickle needs and the opt-in, UnreadableTorchFile
    for a file torch cannot read."""
    path = Path(path)
    source = io.BytesIO(data) if data is not None else path
    try:
        if trust_pickle:
            return torch.load(source, map_location=map_location, weights_only=False)
        with torch.serialization.safe_globals(list(allowed)):
            return _weights_only_load(source, map_location, mmap and data is None)
    except pickle.UnpicklingError as error:
        scanned = io.BytesIO(data) if data is not None else path
        needed = pickle_globals(scanned, allowed) or sorted(set(_REFUSED_GLOBAL.findall(str(error))))
        if not needed:
            raise UnreadableTorchFile(f"{path} is not a readable torch checkpoint ({error})") from None
        remedy = f"if you trust where the file came from, pass {opt_in}" if opt_in else RESAVE
        raise UnsafePickleError(unsafe_message(path, needed, remedy, allowed)) from None
    except (RuntimeError, EOFError, zipfile.BadZipFile) as error:
        raise UnreadableTorchFile(f"{path} is not a readable torch checkpoint ({error})") from None


def unsafe_message(path: Path, needed: list[str], remedy: str, allowed: Sequence[type] = ()) -> str:
    """Why the file at `path` is not unpickled, and `remedy`: what the user can do about it."""
    beyond = " and ".join([PLAIN, *(f"{g.__module__}.{g.__qualname__}" for g in allowed)])
    return (
        f"{path} needs {needed} to unpickle, beyond {beyond}. Unpickling other classes can run code stored "
        f"in the file, so it was not loaded; {remedy}"
    )


def check_pickled_weights(folder: str | Path, model_class: str) -> None:
    """Raise UnsafePickleError naming the file, its classes and how to re-save the weights as safetensors
    when the transformers folder `folder` keeps its weights in `pytorch_model*.bin` files that need more than
    tensors and plain containers. A folder with safetensors weights (which transformers prefers) is not
    looked at. model_class: the transformers class that loads the folder, for the re-save command."""
    folder = Path(folder)
    if any(folder.glob("*.safetensors")):
        return
    for file in sorted(folder.glob("pytorch_model*.bin")):
        needed = pickle_globals(file)
        if needed:
            load = f"{model_class}.from_pretrained('{folder}', weights_only=False)"
            resave = (
                f"if you trust where it came from, re-save the weights as safetensors: "
                f"`{load}.save_pretrained('{folder}')`, then delete {file.name}"
            )
            raise UnsafePickleError(unsafe_message(file, needed, resave))


def _weights_only_load(source, map_location, mmap: bool):
    if not mmap:
        return torch.load(source, map_location=map_location, weights_only=True)
    try:
        return torch.load(source, map_location=map_location, weights_only=True, mmap=True)
    except RuntimeError as error:  # files in torch's legacy format cannot be memory-mapped
        if "mmap" not in str(error):
            raise
        return torch.load(source, map_location=map_location, weights_only=True)
