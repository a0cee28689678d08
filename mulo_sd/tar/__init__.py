"""Tar's first stage (docs/tar.md): its files, checked without loading weights (files.py), its MLLM, which
writes a prompt's TA-Tok tokens (mllm.py), and TA-Tok's decoder (tatok.py).

    from mulo_sd.tar import TarMLLM

TarMLLM, TAR_SAMPLER and TATokDecoder import transformers' Qwen2 and SigLIP2 (seconds), so they are imported
on first use: a set without an MLLM never pays for them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from mulo_sd.tar.files import TAR_FILES_HINT, check_mllm_folder, read_tatok_shape

if TYPE_CHECKING:
    from mulo_sd.tar.mllm import TAR_SAMPLER, TarMLLM
    from mulo_sd.tar.tatok import TATokDecoder

_ON_FIRST_USE = {
    "TarMLLM": "mulo_sd.tar.mllm",
    "TAR_SAMPLER": "mulo_sd.tar.mllm",
    "TATokDecoder": "mulo_sd.tar.tatok",
}

__all__ = [
    "TAR_FILES_HINT",
    "TAR_SAMPLER",
    "TATokDecoder",
    "TarMLLM",
    "check_mllm_folder",
    "read_tatok_shape",
]


def __getattr__(name: str):
    if name in _ON_FIRST_USE:
        return getattr(importlib.import_module(_ON_FIRST_USE[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
