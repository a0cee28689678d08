"""The fixed evaluation prompt set: SynthScenes captions of a held-out stream, with the scene's attribute
record and its real rendering (the reference images of the Frechet distance).

The testbed trains on SynthScenes streams 1 (train) and 2 (validation), see conf/data/synthscenes.yaml;
evaluation uses streams no model has seen. Scene i of a stream is the same on every machine
(synthscenes.render_scene), so a split and a count name a fixed prompt set:
- "dev": the first n scenes of stream `DEV_STREAM` (3), the prompts knobs are chosen on;
- "test": the first n scenes of stream `TEST_STREAM` (4), the prompts results are reported on;
- "all": no split, the first n scenes of stream `seed` (default `EVAL_SEED`, the dev stream).
Dev and test come from different streams, so they never share a scene, whatever the counts.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image

from mulo_sd.testbed.synthscenes import render_scene

EVAL_SEED = 3
DEV_STREAM = EVAL_SEED  # the README's knob settings were chosen on this stream's first 128 scenes
TEST_STREAM = 4
SPLITS = ("dev", "test", "all")
TESTBED_IMAGE_SIZE = 128  # the testbed target's images: 16 x 16 tokens of the ds8 VQ


@dataclass(frozen=True)
class Prompt:
    index: int  # scene number in the stream
    caption: str
    attributes: dict  # the SynthScenes record (what SceneEval's checks should find)
    image: torch.Tensor  # the real scene [3, S, S] in [-1, 1]
    split: str = "all"  # dev, test or all (module docstring); (split, index) names a prompt uniquely


def pil_to_tensor(image: Image.Image) -> torch.Tensor:
    """RGB PIL image -> float tensor [3, H, W] in [-1, 1]."""
    array = np.asarray(image.convert("RGB"), dtype=np.float32)
    return torch.from_numpy(array).permute(2, 0, 1) / 127.5 - 1.0


def evaluation_prompts(
    n: int, seed: int = EVAL_SEED, image_size: int = TESTBED_IMAGE_SIZE, split: str = "all"
) -> list[Prompt]:
    """The first n scenes of the split's stream (module docstring; `seed` picks the stream of split "all"
    only), rendered at `image_size` px."""
    if n < 1:
        raise ValueError(f"need at least one prompt, got n={n}")
    if split not in SPLITS:
        raise ValueError(f"prompts.split must be one of {SPLITS}, got {split!r}")
    if split != "all" and seed != EVAL_SEED:
        raise ValueError(
            f"prompts.seed={seed} picks the stream of split 'all' only; the dev and test splits are the "
            f"fixed streams {DEV_STREAM} and {TEST_STREAM}"
        )
    stream = {"dev": DEV_STREAM, "test": TEST_STREAM}.get(split, seed)
    prompts = []
    for index in range(n):
        image, caption, attributes = render_scene(stream, index, image_size)
        prompts.append(Prompt(index, caption, attributes, pil_to_tensor(image), split))
    return prompts
