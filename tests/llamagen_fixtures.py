"""A tiny LlamaGen text-to-image model set on disk, made the way a user makes the real one: official-layout
files (tests/official_fixtures.py) converted with `mulo-convert` into the folders conf/models/
llamagen_t2i_xl_512.yaml names, a FLAN-T5 folder, and random r=2 samplers over the VQ's codebook.

Sizes: the ds16 VQ at 64 px (4x4 target grid) and 32 px (2x2 drafter grid), 64 codes of 8 dims, 16-d captions.
"""

from __future__ import annotations

from pathlib import Path

import torch
import yaml
from mulo_sd.training.config import CONFIG_DIR

from mulo_sd.llamagen.convert import main as convert
from mulo_sd.nets.downsampler import Downsampler, DownsamplerConfig
from mulo_sd.nets.upsampler import Upsampler, UpsamplerConfig
from mulo_sd.nets.vq import VQModel
from tests.official_fixtures import GPT_HEADS, write_llamagen_gpt, write_llamagen_vq, write_tiny_t5

SET_NAME = "llamagen_t2i_xl_512"
FOLDERS = yaml.safe_load((CONFIG_DIR / "models" / f"{SET_NAME}.yaml").read_text())["folders"]
TARGET_SIZE, DRAFTER_SIZE = 64, 32
SMALL_DRAFTER = "t2i_small_64"  # LANTERN's drafter: one block, the target's resolution


def write_llamagen_set(root: Path, cls_token_num: int = 120, samplers: bool = True) -> Path:
    """Official files under root/official, converted into root/<folder> as the set yaml names them."""
    official = root / "official"
    official.mkdir(parents=True)
    write_llamagen_vq(official / "vq_ds16_t2i.pt")
    assert convert(["llamagen-vq", str(official / "vq_ds16_t2i.pt"), str(root / FOLDERS["vq"])]) == 0
    gpts = {
        FOLDERS["target"]: (TARGET_SIZE, {}),
        FOLDERS["drafter_r2"]: (DRAFTER_SIZE, {}),
        SMALL_DRAFTER: (TARGET_SIZE, {"n_layer": 1}),
    }
    for seed, (folder, (size, shape)) in enumerate(gpts.items()):
        source = official / f"{folder}.pt"
        write_llamagen_gpt(source, size, cls_token_num, seed=seed, **shape)
        assert convert(["llamagen-gpt", str(source), str(root / folder), "--n-head", str(GPT_HEADS)]) == 0
    write_tiny_t5(root / FOLDERS["text_encoder"])
    if samplers:
        write_samplers(root)
    return root


def write_samplers(root: Path, seed: int = 0) -> None:
    """Random r=2 up- and down-samplers for the set's VQ (what the llamagen experiments export)."""
    vq = VQModel.from_pretrained(root / FOLDERS["vq"])
    torch.manual_seed(seed)
    fields = dict(r=2, codebook_size=vq.codebook_size, code_dim=vq.code_dim, width=16, blocks=1)
    Upsampler(UpsamplerConfig(**fields), vq.codebook.detach()).save_pretrained(root / FOLDERS["upsampler_r2"])
    Downsampler(DownsamplerConfig(**fields), vq.codebook.detach()).save_pretrained(
        root / FOLDERS["downsampler_r2"]
    )


def set_overrides(root: Path, *extra: str) -> list[str]:
    """Entry-point overrides for the tiny set on the CPU in float32, with LANTERN's small drafter."""
    return [
        f"models={SET_NAME}", f"models.root={root}", "models.device=cpu", "models.dtype=float32",
        f"models.folders.drafter_small={SMALL_DRAFTER}", *extra,
    ]  # fmt: skip
