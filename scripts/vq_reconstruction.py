"""The testbed VQ's reconstruction at the sizes a grid needs (docs/testbed.md, "The 32x32-token target"):
PSNR and L1 of the encode-decode round trip and the share of the codebook the codes use, on the first
`--scenes` SynthScenes validation scenes (data seed 2) rendered at each size. Tells whether the VQ, trained
at 128 px and below, serves a larger grid unchanged.

    OMP_NUM_THREADS=2 python scripts/vq_reconstruction.py [--sizes 256 128] [--scenes 256]
"""

from __future__ import annotations

import argparse

import torch

from mulo_sd.nets.vq import VQModel
from mulo_sd.pipeline.roles import TESTBED_DIR
from mulo_sd.testbed.prompts import pil_to_tensor
from mulo_sd.testbed.synthscenes import render_scene

VALIDATION_SEED = 2  # conf/data/synthscenes.yaml's validation stream
BATCH = 32


@torch.no_grad()
def reconstruction(vq: VQModel, size: int, scenes: int) -> tuple[float, float, float, tuple[int, int]]:
    """Mean PSNR (dB, images on [-1, 1]), mean L1, codebook share used and the token grid at `size` px."""
    psnr, l1, used, grid = [], [], torch.zeros(vq.config.codebook_size, dtype=torch.bool), (0, 0)
    for start in range(0, scenes, BATCH):
        indices = range(start, min(start + BATCH, scenes))
        images = torch.stack([pil_to_tensor(render_scene(VALIDATION_SEED, i, size)[0]) for i in indices])
        ids = vq.encode(images)
        decoded = vq.decode(ids).clamp(-1, 1)
        mse = (decoded - images).pow(2).flatten(1).mean(1)
        psnr += (10 * torch.log10(4 / mse)).tolist()
        l1 += (decoded - images).abs().flatten(1).mean(1).tolist()
        used[ids.flatten()] = True
        grid = tuple(ids.shape[1:])
    return sum(psnr) / len(psnr), sum(l1) / len(l1), used.float().mean().item(), grid


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[256, 128])
    parser.add_argument("--scenes", type=int, default=256)
    args = parser.parse_args()
    vq = VQModel.from_pretrained(TESTBED_DIR / "vq", "cpu").eval()
    print("| resolution | tokens | PSNR (dB) | L1 (on [-1, 1]) | codebook entries used |")
    print("|---|---|---|---|---|")
    for size in args.sizes:
        psnr, l1, used, (h, w) = reconstruction(vq, size, args.scenes)
        print(f"| {size} px | {h}x{w} | {psnr:.2f} | {l1:.3f} | {100 * used:.1f}% |")


if __name__ == "__main__":
    main()
