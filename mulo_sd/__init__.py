"""MuLo-SD: Multi-Scale Local Speculative Decoding for autoregressive image generators.

    from mulo_sd import MuLoPipeline  # mulo_sd/pipeline/mulo_pipeline.py

`MuLoPipeline` and `__version__` are looked up on first use, so importing a part of the runtime
(`import mulo_sd.nets`) does not import the layers above it.
"""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

__all__ = ["MuLoPipeline", "__version__"]

DISTRIBUTION = "mulo-sd"


def package_version() -> str:
    """The installed distribution's version; from a source tree that is not installed, pyproject.toml's."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        text = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
        return re.search(r'^version = "([^"]+)"', text, re.MULTILINE).group(1)


def __getattr__(name: str):
    if name == "MuLoPipeline":
        from mulo_sd.pipeline.mulo_pipeline import MuLoPipeline

        return MuLoPipeline
    if name == "__version__":
        globals()["__version__"] = version = package_version()  # looked up once
        return version
    raise AttributeError(f"module 'mulo_sd' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
