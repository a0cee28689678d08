"""`mulo-data ar-samples`: shards of a model set's own AR samples, for up-samplers taught what the target
draws rather than what the scenes hold.

Each sample is the AR decode of one SynthScenes training caption (scene `index` of `--caption-seed`, as
`mulo-data synthscenes` renders it) at the set's sampling defaults, seeded with `--seed` + index: its image
(png, the VQ's decode of the AR tokens), the caption (txt) and {"index", "seed", "source": "ar"} (json).
The images are decoded in batches (`--batch-size`; each image has its own generator, so a sample does not
depend on the batch it was in) and written `--shard-size` per shard; a rerun with the same arguments resumes
after the last complete shard instead of writing the folder again.
"""

from __future__ import annotations

import argparse
import io
import json
import os

from mulo_sd.data.shards import SIZES_NAME, shard_spec, write_shards
from tqdm import tqdm

from mulo_sd.testbed.synthscenes import render_scene

AR_PREFIX = "ar"
MANIFEST = "ar_samples.json"


def add_ar_samples_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, help="folder for the shards")
    parser.add_argument("--count", type=int, required=True, help="samples to write")
    parser.add_argument("--models", default="testbed", help="model set: a name, a set file or a folder")
    parser.add_argument("--seed", type=int, default=0, help="sample i decodes with seed + i")
    parser.add_argument("--caption-seed", type=int, default=1, help="SynthScenes seed of the captions")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--shard-size", type=int, default=800)
    parser.add_argument("--device", default="cpu")


def run_ar_samples(args: argparse.Namespace) -> int:
    for name in ("count", "batch_size", "shard_size"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    settings = {k: getattr(args, k) for k in ("models", "seed", "caption_seed", "shard_size")}
    done = resume_point(args.out, settings)
    held = sum(listed_sizes(args.out).values())
    if held >= args.count:
        print(f"{args.out} already holds {held} samples")
        return 0
    write_shards(
        ar_samples(args, range(done, args.count)),
        args.out,
        AR_PREFIX,
        args.shard_size,
        done // args.shard_size,
    )
    print(shard_spec(args.out, sorted(listed_sizes(args.out))))  # the whole folder, also after a resume
    return 0


def resume_point(out: str, settings: dict) -> int:
    """Samples already written by a run with the same settings: the leading shards that sizes.json lists as
    full (a short last shard, from a smaller --count, is written again from its first sample); a folder made
    with other settings is refused."""
    manifest = os.path.join(out, MANIFEST)
    if os.path.exists(manifest):
        with open(manifest) as f:
            theirs = json.load(f)
        if theirs != settings:
            raise SystemExit(f"{out} holds AR samples made with {theirs}, not {settings}: use another --out")
    else:
        if os.path.isdir(out) and os.listdir(out):
            raise SystemExit(f"{out} is not empty and has no {MANIFEST}: use an empty or new folder")
        os.makedirs(out, exist_ok=True)
        with open(manifest, "w") as f:
            json.dump(settings, f, indent=1)
    sizes = listed_sizes(out)
    full = 0
    while sizes.get(f"{AR_PREFIX}-{full:06d}.tar") == settings["shard_size"]:
        full += 1
    return full * settings["shard_size"]


def listed_sizes(out: str) -> dict[str, int]:
    """{shard name: sample count} of the folder's sizes.json ({} before the first shard is written)."""
    path = os.path.join(out, SIZES_NAME)
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return json.load(f)


def ar_samples(args: argparse.Namespace, indices: range):
    import torch

    from mulo_sd.pipeline.decode_entry import decode, tensor_to_pil
    from mulo_sd.pipeline.model_set import load_model_set
    from mulo_sd.pipeline.mulo_pipeline import MuLoPipeline

    pipe = MuLoPipeline.from_pretrained(args.models, device=args.device)
    models = load_model_set(pipe.model_set, ["vq", "target"], pipe.device)
    bar = tqdm(total=len(indices), desc="AR samples", unit="img")
    for first in range(indices.start, indices.stop, args.batch_size):
        batch = list(range(first, min(first + args.batch_size, indices.stop)))
        captions = [render_scene(args.caption_seed, i, 8)[1] for i in batch]
        seeds = [args.seed + i for i in batch]
        with torch.inference_mode():
            result = decode("ar", models, captions, {}, pipe.sampler, seeds)
        for j, index in enumerate(batch):
            png = io.BytesIO()
            tensor_to_pil(result.image[j]).save(png, format="PNG")
            record = {"index": index, "seed": seeds[j], "source": "ar"}
            yield {
                "__key__": f"{index:09d}",
                "png": png.getvalue(),
                "txt": captions[j].encode("utf-8"),
                "json": json.dumps(record, sort_keys=True).encode("utf-8"),
            }
        bar.update(len(batch))
