"""Prompt sets read from local files, for evaluating models on real prompts (docs/real_evaluation.md).

    prompt_set = load_prompt_set("annotations/captions_val2017.json", "coco", images="val2017")
    dev, test = split_dev_test(prompt_set.prompts, dev_count=1000, seed=0)

Formats (`FORMATS`):
- coco: an MS-COCO captions file (`captions_val2017.json`: `images` with `id` and `file_name`, `annotations`
  with `image_id` and `caption`). One prompt per image, images in id order (val2017: the 5k split); which of
  an image's captions is drawn from `seed` and the image id alone, so a prompt does not change with `count`.
  With `images` (the val2017 folder) each prompt names its real image.
- mjhq: MJHQ-30k's `meta_data.json` (`{image name: {"prompt", "category"}}`), in name order; the real image
  is `images/<category>/<name>.jpg`.
- geneval: GenEval's `evaluation_metadata.jsonl` (one JSON object per line with `prompt` and `tag`); the
  whole line is kept as the prompt's metadata, which the GenEval output format writes back unchanged.
- dpg: DPG-Bench's `dpg_bench/prompts/` folder of the ELLA repository (one `<item_id>.txt` per prompt, 1,065
  of them), numbered item_ids in number order then named ones in name order; the item_id names the prompt's
  grid in the DPG-Bench layout (mulo_sd/evaluation/dpg_format.py).
- lines: plain text, one prompt per line.
Blank lines (geneval, lines) and COCO images without a caption are skipped and counted; any other bad entry
is an error naming the file, the entry and the field.

A prompt's `index` is its position in the whole file (blank lines not counted), so `count` and the dev/test
split never renumber prompts and output folders stay comparable between runs.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path

FORMATS = ("coco", "mjhq", "geneval", "dpg", "lines")


@dataclass(frozen=True)
class PromptRecord:
    index: int  # position in the file's full set
    text: str
    metadata: dict = field(
        default_factory=dict
    )  # coco: image_id, file_name; mjhq: name, category; geneval: line; dpg: item_id
    reference: Path | None = None  # the prompt's real image, when the format and `images` give one


@dataclass
class PromptSet:
    prompts: list[PromptRecord]
    source: Path
    format: str
    skipped: int = 0  # blank lines / images without a caption
    skip_reason: str = ""


def load_prompt_set(
    path: str | Path,
    format: str,
    count: int | None = None,
    seed: int = 0,
    images: str | Path | None = None,
) -> PromptSet:
    """The first `count` prompts (None: all) of the prompt file (dpg: folder) `path` in `format` (module
    docstring)."""
    path = Path(path)
    if format not in FORMATS:
        raise ValueError(f"unknown prompt format '{format}' for {path}; choose one of {list(FORMATS)}")
    if format == "dpg" and not path.is_dir():
        raise FileNotFoundError(f"DPG-Bench prompt folder (ELLA's dpg_bench/prompts) not found: {path}")
    if format != "dpg" and not path.is_file():
        raise FileNotFoundError(f"prompt file not found: {path}")
    if images is not None and format in ("geneval", "dpg", "lines"):
        raise ValueError(f"prompts.images applies to the coco and mjhq formats, not to '{format}' ({path})")
    images = Path(images) if images is not None else None
    if images is not None and not images.is_dir():
        raise FileNotFoundError(f"image folder of the {format} prompts not found: {images}")
    readers = {"coco": _coco, "mjhq": _mjhq, "geneval": _geneval, "dpg": _dpg, "lines": _lines}
    prompts, skipped, reason = readers[format](path, seed, images)
    if count is not None:
        if count < 1 or count > len(prompts):
            raise ValueError(f"prompts.count={count}, but {path} holds {len(prompts)} {format} prompts")
        prompts = prompts[:count]
    return PromptSet(prompts, path, format, skipped, reason)


def split_dev_test(prompts: list, dev_count: int, seed: int = 0) -> tuple[list, list]:
    """A seeded random split into `dev_count` dev prompts and the rest as test prompts, each in the input
    order: disjoint, together the whole set."""
    if not 1 <= dev_count < len(prompts):
        raise ValueError(
            f"the dev split needs 1 to {len(prompts) - 1} of the {len(prompts)} prompts, got {dev_count}"
        )
    positions = list(range(len(prompts)))
    random.Random(seed).shuffle(positions)
    dev = set(positions[:dev_count])
    return (
        [p for i, p in enumerate(prompts) if i in dev],
        [p for i, p in enumerate(prompts) if i not in dev],
    )


def _load_json(path: Path):
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not valid JSON: {error}") from None


def _field(entry: dict, name: str, kind: type, path: Path, where: str):
    if not isinstance(entry, dict) or not isinstance(entry.get(name), kind):
        raise ValueError(f"{path}: {where} needs a {kind.__name__} field '{name}', got {entry!r:.200}")
    return entry[name]


def _coco(path: Path, seed: int, images: Path | None):
    data = _load_json(path)
    for name in ("images", "annotations"):
        _field(data, name, list, path, "the top level")
    captions: dict[int, list[tuple[int, str]]] = {}
    for n, annotation in enumerate(data["annotations"]):
        image_id = _field(annotation, "image_id", int, path, f"annotations[{n}]")
        caption = _field(annotation, "caption", str, path, f"annotations[{n}]")
        captions.setdefault(image_id, []).append((annotation.get("id", n), caption.strip()))
    entries = []
    for n, image in enumerate(data["images"]):
        entries.append(
            (
                _field(image, "id", int, path, f"images[{n}]"),
                _field(image, "file_name", str, path, f"images[{n}]"),
            )
        )
    prompts, skipped = [], 0
    for image_id, file_name in sorted(entries):
        choices = sorted(captions.get(image_id, []))
        if not choices:
            skipped += 1
            continue
        # seeded by (seed, image id) alone: an image's caption does not depend on which other images are read
        _, caption = choices[random.Random(f"{seed}:{image_id}").randrange(len(choices))]
        reference = images / file_name if images is not None else None
        metadata = {"image_id": image_id, "file_name": file_name}
        prompts.append(PromptRecord(len(prompts), caption, metadata, reference))
    return prompts, skipped, "images without a caption"


def _mjhq(path: Path, seed: int, images: Path | None):
    data = _load_json(path)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: MJHQ meta data is an object {{image name: {{prompt, category}}}}")
    prompts = []
    for name in sorted(data):
        text = _field(data[name], "prompt", str, path, f"entry '{name}'")
        category = _field(data[name], "category", str, path, f"entry '{name}'")
        reference = images / category / f"{name}.jpg" if images is not None else None
        prompts.append(PromptRecord(len(prompts), text, {"name": name, "category": category}, reference))
    return prompts, 0, ""


def _geneval(path: Path, seed: int, images: Path | None):
    prompts, skipped = [], 0
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            skipped += 1
            continue
        try:
            entry = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}, line {number}: not a JSON object ({error})") from None
        text = _field(entry, "prompt", str, path, f"line {number}")
        _field(entry, "tag", str, path, f"line {number}")  # GenEval's scorer needs the task tag
        prompts.append(PromptRecord(len(prompts), text, entry))
    return prompts, skipped, "blank lines"


def _dpg(path: Path, seed: int, images: Path | None):
    # numbered item_ids in number order, then the named ones (COCOval2014..., ...) in name order
    files = sorted(
        path.glob("*.txt"), key=lambda f: (0, int(f.stem), "") if f.stem.isdigit() else (1, 0, f.stem)
    )
    prompts, skipped = [], 0
    for file in files:
        text = file.read_text().strip()
        if not text:
            skipped += 1
            continue
        prompts.append(PromptRecord(len(prompts), text, {"item_id": file.stem}))
    return prompts, skipped, "empty prompt files"


def _lines(path: Path, seed: int, images: Path | None):
    prompts, skipped = [], 0
    for line in path.read_text().splitlines():
        if not line.strip():
            skipped += 1
            continue
        prompts.append(PromptRecord(len(prompts), line.strip()))
    return prompts, skipped, "blank lines"
