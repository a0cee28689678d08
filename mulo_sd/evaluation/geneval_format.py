"""GenEval's image-folder layout, so its official scorer (djghosh13/geneval, evaluation/evaluate_images.py)
runs on a run's folder unchanged:

    <run folder>/
        00000/                  the prompt's index, five digits (the scorer reads all-digit folder names)
            metadata.jsonl      one JSON object: the prompt's line of evaluation_metadata.jsonl
            samples/
                0000.png        one image per seed, named by the seed (the scorer reads \\d+\\.png)

Every prompt format is written this way (its metadata: `{"prompt": ...}` plus the format's own fields), so
one reader serves all of them; only geneval prompts carry the `tag` and `include` fields the scorer needs.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from PIL import Image

from mulo_sd.evaluation.prompt_sets import PromptRecord

SAMPLE_NAME = re.compile(r"(\d+)\.png")


def prompt_folder(run_dir: Path, index: int) -> Path:
    return run_dir / f"{index:05d}"


def sample_path(run_dir: Path, index: int, seed: int) -> Path:
    if seed < 0:
        raise ValueError(f"seeds name the sample files and must be >= 0, got {seed}")
    return prompt_folder(run_dir, index) / "samples" / f"{seed:04d}.png"


def prompt_metadata(prompt: PromptRecord) -> dict:
    """What metadata.jsonl holds: a geneval prompt's own line, else the prompt and the format's fields."""
    return {"prompt": prompt.text, **prompt.metadata}


def write_metadata(run_dir: Path, prompt: PromptRecord) -> None:
    """Write the prompt's metadata.jsonl (once; an existing identical file is left alone)."""
    path = prompt_folder(run_dir, prompt.index) / "metadata.jsonl"
    text = json.dumps(prompt_metadata(prompt)) + "\n"
    if path.is_file() and path.read_text() == text:
        return
    (path.parent / "samples").mkdir(parents=True, exist_ok=True)
    _atomic_write(path, lambda tmp: tmp.write_text(text))


def save_sample(image: Image.Image, path: Path) -> None:
    """Write the PNG under a temporary name first, so a killed run never leaves a truncated image behind."""
    path.parent.mkdir(parents=True, exist_ok=True)
    _atomic_write(path, lambda tmp: image.save(tmp, format="PNG"))


def _atomic_write(path: Path, write) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    write(tmp)
    os.replace(tmp, path)


def list_samples(run_dir: Path) -> list[tuple[int, int, Path]]:
    """(prompt index, seed, path) of every sample in the layout, found the way GenEval's scorer finds them."""
    found = []
    for folder in sorted(Path(run_dir).iterdir()):
        if not folder.is_dir() or not folder.name.isdigit():
            continue
        json.loads((folder / "metadata.jsonl").read_text())  # the scorer reads it with json.load
        for sample in sorted((folder / "samples").iterdir()):
            match = SAMPLE_NAME.fullmatch(sample.name)
            if match and sample.is_file():
                found.append((int(folder.name), int(match.group(1)), sample))
    return found
