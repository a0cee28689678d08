"""docs/ar_vs_mulo.png, the README's picture: plain AR and MuLo-SD (2x) at their default knobs on the first
test prompts of the testbed (mulo_sd/testbed/prompts.py, split test), the same seed for both, the real scene
of each prompt on top. Each row's label gives its mean sequential target steps per image.

    python scripts/ar_vs_mulo_figure.py [--prompts 5] [--seed 0] [--out docs/ar_vs_mulo.png]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from PIL import Image

from mulo_sd import MuLoPipeline
from mulo_sd.evaluation.plots import grid_figure
from mulo_sd.testbed.prompts import evaluation_prompts, pil_to_tensor

ROWS = {"ar": "AR", "mulo": "MuLo-SD (2x)"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("docs/ar_vs_mulo.png"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    prompts = evaluation_prompts(args.prompts, split="test")
    captions = [p.caption for p in prompts]
    pipe = MuLoPipeline.from_pretrained("testbed")
    images, labels = [[p.image for p in prompts]], ["real scene"]
    for method, name in ROWS.items():
        out = pipe(captions, method=method, seed=args.seed)
        steps = sum(s.sequential_steps for s in out.stats) / len(out.stats)
        images.append([pil_to_tensor(image) for image in out.images])
        labels.append(f"{name}: {steps:.0f} steps")
    figure = grid_figure(images, labels, captions)
    figure.savefig(args.out, dpi=80)
    # 256-colour palette: the figure stays small enough to sit in the README
    Image.open(args.out).convert("RGB").quantize(256).save(args.out, optimize=True)
    print(f"wrote {args.out} ({args.out.stat().st_size / 1000:.0f} kB)")


if __name__ == "__main__":
    main()
