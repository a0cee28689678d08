"""Held-out accuracy of SceneEval's background head per background kind, on real SynthScenes scenes and on
their tokenizer round trips (encode -> decode: what a tokenizer-perfect generation looks like to SceneEval),
printed as a markdown table.

    python -m mulo_sd.testbed.background_accuracy --count 2000

The scenes are the first `count` of stream TEST_STREAM (mulo_sd/testbed/prompts.py), which no model trains
on (training reads streams 1 and 2).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from mulo_sd.nets.vq import VQModel
from mulo_sd.testbed.prompts import TEST_STREAM, TESTBED_IMAGE_SIZE, pil_to_tensor
from mulo_sd.testbed.sceneeval import SceneEval
from mulo_sd.testbed.synthscenes import BACKGROUNDS, render_scene

TESTBED_DIR = Path(__file__).resolve().parents[1] / "assets" / "testbed"


@torch.no_grad()
def read_backgrounds(
    model: SceneEval, vq: VQModel, stream: int, count: int, batch_size: int = 64
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """True kinds, kinds read from the real scenes and from their round trips (int64 [count] each, indices
    into BACKGROUNDS) of the first `count` scenes of `stream`."""
    truth, real, round_trip = [], [], []
    for start in range(0, count, batch_size):
        scenes = [
            render_scene(stream, i, TESTBED_IMAGE_SIZE) for i in range(start, min(count, start + batch_size))
        ]
        images = torch.stack([pil_to_tensor(image) for image, _, _ in scenes])
        truth += [BACKGROUNDS.index(attributes["background"]["kind"]) for _, _, attributes in scenes]
        real.append(model.predict_background(images))
        round_trip.append(model.predict_background(vq.decode(vq.encode(images)).clamp(-1, 1)))
    return torch.tensor(truth), torch.cat(real), torch.cat(round_trip)


def accuracy_table(truth: torch.Tensor, real: torch.Tensor, round_trip: torch.Tensor) -> str:
    """Markdown table: per kind (then all), the number of scenes and the accuracy on each image set."""
    lines = ["| background | scenes | real | VQ round trip |", "|---|---|---|---|"]
    groups = [(kind, truth == k) for k, kind in enumerate(BACKGROUNDS)] + [
        ("all", torch.ones_like(truth, dtype=bool))
    ]
    for name, chosen in groups:
        n = int(chosen.sum())
        accuracies = [
            f"{100 * float((read[chosen] == truth[chosen]).float().mean()):.1f}%" if n else "-"
            for read in (real, round_trip)
        ]
        lines.append(f"| {name} | {n} | {accuracies[0]} | {accuracies[1]} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=2000, help="scenes of the held-out stream")
    parser.add_argument("--stream", type=int, default=TEST_STREAM, help="SynthScenes stream (not 1 or 2)")
    parser.add_argument("--sceneeval", default=str(TESTBED_DIR / "sceneeval"), help="SceneEval folder")
    parser.add_argument("--vq", default=str(TESTBED_DIR / "vq"), help="tokenizer folder of the round trips")
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args(argv)
    if args.count < 1:
        parser.error(f"--count must be >= 1, got {args.count}")
    model, vq = SceneEval.from_pretrained(args.sceneeval), VQModel.from_pretrained(args.vq)
    print(accuracy_table(*read_backgrounds(model, vq, args.stream, args.count, args.batch_size)))


if __name__ == "__main__":
    main()
