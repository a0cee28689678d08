"""Where the pixel path's detail goes (docs/super_resolution.md, section 3): the texture statistic
(mulo_sd/evaluation/texture.py) of the 128 px renders, of their VQ round trip, and of the enlarged draft,
SR network vs bicubic, before and after VQ-encoding it, at r=2 and r=4. Inputs as the SR networks' training
and validation see them: the first `--scenes` SynthScenes validation scenes (data seed 2), box-downscaled
to 128/r px, through the testbed VQ.

    OMP_NUM_THREADS=1 python scripts/sr_draft_texture.py [--scenes 128]
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from mulo_sd.evaluation.texture import texture
from mulo_sd.nets.sr_network import SRNetwork
from mulo_sd.nets.vq import VQModel
from mulo_sd.pipeline.roles import TESTBED_DIR
from mulo_sd.testbed.synthscenes import render_scene

VALIDATION_SEED, SIZE = 2, 128  # conf/data/synthscenes.yaml's validation stream


def as_tensor(images: list[Image.Image]) -> torch.Tensor:
    return torch.from_numpy(np.stack([np.asarray(i) for i in images])).permute(0, 3, 1, 2).float() / 127.5 - 1


@torch.no_grad()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenes", type=int, default=128)
    args = parser.parse_args()
    vq = VQModel.from_pretrained(TESTBED_DIR / "vq", "cpu").eval()

    def round_trip(x: torch.Tensor) -> torch.Tensor:
        return vq.decode(vq.encode(x)).clamp(-1, 1)

    renders = [render_scene(VALIDATION_SEED, i, SIZE)[0] for i in range(args.scenes)]
    high = as_tensor(renders)
    print(f"renders {texture(high).mean():.2f}, their VQ round trip {texture(round_trip(high)).mean():.2f}")
    for r in (2, 4):
        draft = round_trip(as_tensor([i.resize((SIZE // r,) * 2, Image.Resampling.BOX) for i in renders]))
        enlarged = {
            "SR network": SRNetwork(TESTBED_DIR / f"sr_x{r}", r)(draft).clamp(-1, 1),
            "bicubic": F.interpolate(draft, size=(SIZE, SIZE), mode="bicubic", antialias=True).clamp(-1, 1),
        }
        for name, image in enlarged.items():
            after = texture(round_trip(image)).mean()
            print(f"x{r} {name}: enlarged {texture(image).mean():.2f}, VQ-encoded and decoded {after:.2f}")


if __name__ == "__main__":
    main()
