"""The fixed evaluation prompt set: SynthScenes captions of a held-out stream, with the scene's attribute
record and its real rendering (the reference images of the Frechet distance).

The testbed trains on SynthScenes streams 1 (train) and 2 (validation), see conf/data/synthscenes.yaml;
evaluation uses stream `EVAL_SEED`, which no model has seen. Scene i of a stream is the same on every machine
(synthscenes.render_scene), so `evaluation_prompts(n)` is the first n scenes of it, always.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image

from mulo_sd.synthscenes import render_scene

EVAL_SEED = 3
TESTBED_IMAGE_SIZE = 128  # the testbed target's images: 16 x 16 tokens of the ds8 VQ


@dataclass(frozen=True)
class Prompt:
    index: int  # scene number in the stream
    caption: str
    attributes: dict  # the SynthScenes record (what SceneEval's checks should find)
    image: torch.Tensor  # the real scene [3, S, S] in [-1, 1]


def pil_to_tensor(image: Image.Image) -> torch.Tensor:
    """RGB PIL image -> float tensor [3, H, W] in [-1, 1]."""
    array = np.asarray(image.convert("RGB"), dtype=np.float32)
    return torch.from_numpy(array).permute(2, 0, 1) / 127.5 - 1.0


def evaluation_prompts(n: int, seed: int = EVAL_SEED, image_size: int = TESTBED_IMAGE_SIZE) -> list[Prompt]:
    """The first n scenes of SynthScenes stream `seed`, rendered at `image_size` px."""
    if n < 1:
        raise ValueError(f"need at least one prompt, got n={n}")
    prompts = []
    for index in range(n):
        image, caption, attributes = render_scene(seed, index, image_size)
        prompts.append(Prompt(index, caption, attributes, pil_to_tensor(image)))
    return prompts
