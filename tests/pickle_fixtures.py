"""Crafted pickle files: what an untrusted checkpoint could hold. Unpickling a `WritesMarker` creates its
marker file, so a test that loads a file holding one and then finds no marker knows nothing was run."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file


class WritesMarker:
    """Unpickling this opens (creates) `marker` for writing: code run from the file."""

    def __init__(self, marker: str | Path):
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, "w")


def save_hostile(path: str | Path, marker: str | Path, content=None) -> Path:
    """torch.save of `content` (a dict; default empty) with a WritesMarker under "hook"."""
    torch.save({**(content or {}), "hook": WritesMarker(marker)}, path)
    return Path(path)


def make_bin_hostile(folder: str | Path, marker: str | Path) -> Path:
    """Turn a save_pretrained folder's model.safetensors into a pytorch_model.bin holding the same tensors and
    a WritesMarker; returns the .bin."""
    folder = Path(folder)
    state = load_file(folder / "model.safetensors")
    (folder / "model.safetensors").unlink()
    return save_hostile(folder / "pytorch_model.bin", marker, state)
