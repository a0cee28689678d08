"""`mulo-data`: build and check the webdataset shards that training reads.

    mulo-data synthscenes --out shards/synthscenes --count 50000 --seed 0 --size 128 --workers 2
    mulo-data from-folder --images my_photos/ --out shards/photos
    mulo-data verify "shards/synthscenes/synthscenes-{000000..000049}.tar"     (or a directory)
    mulo-data pretokenize --shards "shards/synthscenes/synthscenes-{000000..000049}.tar" \
        --tokenizer mulo_sd/assets/testbed/vq --sizes 128 64 32 --out shards/synthscenes_tokens
    mulo-data ar-samples --out shards/ar_samples --count 6400 --batch-size 32 --seed 100000   (ar_samples.py)

Every command that writes shards also writes `sizes.json` ({shard file name: sample count}, as open_clip
reads it) and prints the brace-expanded shard spec to give the training config. Each shard is written under a
temporary name and renamed when complete, so an interrupted run leaves no truncated shard behind.
`synthscenes` and `from-folder` refuse a non-empty --out, where other shards would mix with the new ones
(out_folder.py): `--overwrite` deletes the command's own shards first; `synthscenes --start-index` adds to
shards of the same seed and size. `from-folder` skips (and names) files that do not decode as images and
stops with an error naming a caption file that is not UTF-8. `verify` (shard_check.py) fails samples that
have neither an image nor a `.npy` token grid, images beyond the datamodule's size limits (`--max-pixels`,
`--max-aspect-ratio`, as data.max_pixels and data.max_aspect_ratio), samples without a caption (unless
`--allow-missing-captions`: data for VQ and sampler training only) and shards without samples.

LAION-COCO-Aesthetic needs no conversion: img2dataset already writes webdataset shards. Download it with
`img2dataset --url_list <parquet files> --input_format parquet --url_col URL --caption_col <caption column>
--output_format webdataset --output_folder /data/laion-coco-aes ...`; the folder then holds `00000.tar,
00001.tar, ...`, each sample a `.jpg` image, a `.txt` caption and a `.json` record (the `.parquet` and
`_stats.json` files next to the shards are not read). Give the training data config its shard spec, e.g.
`/data/laion-coco-aes/{00000..01234}.tar`. `mulo-data verify /data/laion-coco-aes --write-sizes` decodes
every sample, lists the corrupt ones and writes the sizes.json that img2dataset does not.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import json
import multiprocessing
import os
import re
import sys

import webdataset as wds
from mulo_sd.data.ar_samples import add_ar_samples_arguments, run_ar_samples
from mulo_sd.data.from_folder import add_from_folder_arguments, run_from_folder
from mulo_sd.data.image_limits import DEFAULT_MAX_ASPECT_RATIO, DEFAULT_MAX_PIXELS, ImageLimits
from mulo_sd.data.out_folder import prepare_out_folder
from mulo_sd.data.pretokenize import add_pretokenize_arguments, run_pretokenize
from mulo_sd.data.shard_check import ShardReport, check_shard
from mulo_sd.data.shards import SIZES_NAME, expand_spec, shard_spec, update_sizes, write_shards
from tqdm import tqdm

from mulo_sd.testbed.synthscenes import MIN_SIZE, render_scene

SYNTHSCENES_PREFIX = "synthscenes"
SYNTHSCENES_MANIFEST = "synthscenes.json"  # written by data/synthscenes_cache.py
SYNTHSCENES_SHARD = re.compile(rf"{SYNTHSCENES_PREFIX}-(\d+)\.tar")


def synthscenes_sample(index: int, seed: int, size: int) -> dict:
    """One SynthScenes webdataset sample; a top-level function so worker processes can run it."""
    image, caption, attributes = render_scene(seed, index, size)
    png = io.BytesIO()
    image.save(png, format="PNG")
    return {
        "__key__": f"{index:09d}",
        "png": png.getvalue(),
        "txt": caption.encode("utf-8"),
        "json": json.dumps(attributes, sort_keys=True).encode("utf-8"),
    }


def add_synthscenes_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, help="output directory for the shards and sizes.json")
    parser.add_argument("--count", type=int, required=True, help="number of scenes")
    parser.add_argument("--seed", type=int, required=True, help="scene i depends on (seed, i) only")
    parser.add_argument("--size", type=int, required=True, help="image side in pixels")
    parser.add_argument("--shard-size", type=int, default=1000, help="samples per shard")
    parser.add_argument("--workers", type=int, default=1, help="rendering processes (no effect on output)")
    parser.add_argument(
        "--start-index",
        type=int,
        default=0,
        help="first scene index (a multiple of --shard-size); shard numbers continue from it, "
        "so runs over disjoint index ranges of the same --seed and --size can share a directory",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="delete the SynthScenes shards already in --out first (without it, a non-empty --out is "
        "refused unless --start-index adds to shards of the same --seed and --size)",
    )


def run_synthscenes(args: argparse.Namespace) -> int:
    sizes = write_synthscenes(args)
    print(f"wrote {args.count} scenes to {len(sizes)} shards")
    print(shard_spec(args.out, sizes))
    return 0


def write_synthscenes(args: argparse.Namespace) -> dict[str, int]:
    """Render the scenes `args` (the `synthscenes` arguments) asks for into shards; returns their sizes."""
    check_synthscenes_arguments(args)
    prepare_synthscenes_folder(args)
    return render_synthscenes(args)


def check_synthscenes_arguments(args: argparse.Namespace) -> None:
    if args.count < 1 or args.workers < 1 or args.shard_size < 1:
        raise SystemExit("mulo-data synthscenes: --count, --workers and --shard-size must be >= 1")
    if args.size < MIN_SIZE:
        raise SystemExit(f"mulo-data synthscenes: --size must be >= {MIN_SIZE} px, got {args.size}")
    if args.start_index < 0 or args.start_index % args.shard_size:
        raise SystemExit(
            f"mulo-data synthscenes: --start-index must be a non-negative multiple of "
            f"--shard-size ({args.shard_size}), got {args.start_index}"
        )


def render_synthscenes(args: argparse.Namespace) -> dict[str, int]:
    """Render the scenes of checked `args` into shards of a folder prepared for them; returns their sizes."""
    indices = range(args.start_index, args.start_index + args.count)
    make = functools.partial(synthscenes_sample, seed=args.seed, size=args.size)
    with contextlib.ExitStack() as stack:
        if args.workers == 1:
            samples = map(make, indices)
        else:  # imap keeps index order, so the shards do not depend on the number of workers
            pool = stack.enter_context(multiprocessing.Pool(args.workers))
            samples = pool.imap(make, indices, chunksize=max(1, min(64, args.count // (8 * args.workers))))
        samples = tqdm(samples, total=args.count, desc="synthscenes", unit="scene")
        return write_shards(
            samples,
            args.out,
            SYNTHSCENES_PREFIX,
            args.shard_size,
            start_shard=args.start_index // args.shard_size,
        )


def synthscenes_shards(folder: str) -> dict[str, int]:
    """{file name: shard number} of the finished SynthScenes shards in `folder`, in name order."""
    matches = (SYNTHSCENES_SHARD.fullmatch(name) for name in sorted(os.listdir(folder)))
    return {match[0]: int(match[1]) for match in matches if match}


def prepare_synthscenes_folder(args: argparse.Namespace) -> None:
    """Keep scenes of other arguments out of `args.out`: refuse a non-empty folder, clear its SynthScenes with
    --overwrite, or with --start-index check that it holds only shards of scenes of the same arguments."""
    prepare_out_folder(
        "synthscenes",
        args.out,
        SYNTHSCENES_PREFIX,
        args.overwrite,
        owned=[SYNTHSCENES_MANIFEST],
        may_add=functools.partial(adds_to_same_scenes, args),
        alternative=", or --start-index to add scenes of the same --seed and --size",
    )


def adds_to_same_scenes(args: argparse.Namespace, entries: list[str]) -> bool:
    """Whether --start-index adds new shards to a folder of scenes of the same arguments (raises when the
    folder holds them but the new shard numbers are taken or the scenes differ)."""
    shards = synthscenes_shards(args.out)
    if not (args.start_index > 0 and shards and set(entries) <= {*shards, SIZES_NAME}):
        return False
    new = range(
        args.start_index // args.shard_size, (args.start_index + args.count - 1) // args.shard_size + 1
    )
    taken = [name for name, number in shards.items() if number in new]
    if taken:
        raise SystemExit(
            f"mulo-data synthscenes: {args.out} already holds {taken[0]}: use another --start-index"
        )
    name, number = next(iter(shards.items()))
    check_same_scenes(os.path.join(args.out, name), number, args)
    return True


def check_same_scenes(shard: str, number: int, args: argparse.Namespace) -> None:
    """Re-render the first scene of shard `number` with this run's arguments: its bytes must match."""
    sample = next(iter(wds.DataPipeline(wds.SimpleShardList([shard]), wds.tarfile_to_samples())), {})
    index = number * args.shard_size
    if (
        sample.get("__key__") != f"{index:09d}"
        or sample.get("png") != synthscenes_sample(index, args.seed, args.size)["png"]
    ):
        raise SystemExit(
            f"mulo-data synthscenes: {shard} does not hold scenes of --seed {args.seed} --size {args.size} "
            f"--shard-size {args.shard_size}: add to it with the arguments that made it, or pass --overwrite"
        )


def add_verify_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", help="shard spec (dir/name-{000000..000009}.tar) or a directory")
    parser.add_argument(
        "--write-sizes",
        action="store_true",
        help="also write sizes.json (samples per readable shard) next to the shards",
    )
    parser.add_argument(
        "--allow-missing-captions",
        action="store_true",
        help="pass samples without a (non-blank) .txt caption, for data that trains only caption-free "
        "modules (VQ, samplers): without it they are listed and fail the check",
    )
    parser.add_argument(
        "--max-pixels",
        type=int,
        default=DEFAULT_MAX_PIXELS,
        help="images with more pixels are listed as too large (as data.max_pixels, which skips them)",
    )
    parser.add_argument(
        "--max-aspect-ratio",
        type=float,
        default=DEFAULT_MAX_ASPECT_RATIO,
        help="images more elongated (long side : short side) are listed as too large (data.max_aspect_ratio)",
    )


def run_verify(args: argparse.Namespace) -> int:
    try:
        paths = expand_spec(args.spec)
        limits = ImageLimits(args.max_pixels, args.max_aspect_ratio)
    except ValueError as error:
        raise SystemExit(f"mulo-data verify: {error}") from None
    counts = dict.fromkeys(["total", "corrupt", "too large", "no caption", "unreadable", "empty"], 0)
    sizes_by_dir: dict[str, dict[str, int]] = {}
    for path in tqdm(paths, desc="verify", unit="shard"):
        report = check_shard(path, limits)
        print_report(report, counts, list_uncaptioned=not args.allow_missing_captions)
        if report.unreadable is None:
            sizes_by_dir.setdefault(os.path.dirname(path), {})[os.path.basename(path)] = report.samples
    failed = (
        counts["corrupt"] + counts["too large"] + (0 if args.allow_missing_captions else counts["no caption"])
    )
    print(f"shards: {len(paths)}  unreadable shards: {counts['unreadable']}  empty shards: {counts['empty']}")
    print(
        f"total: {counts['total']}  ok: {counts['total'] - failed}  corrupt: {counts['corrupt']}  "
        f"too large: {counts['too large']}  no caption: {counts['no caption']}"
        + ("  (allowed)" if args.allow_missing_captions else "")
    )
    if args.write_sizes:
        for directory, sizes in sizes_by_dir.items():
            update_sizes(directory, sizes)
    return 1 if failed or counts["unreadable"] or counts["empty"] else 0


def print_report(report: ShardReport, counts: dict[str, int], list_uncaptioned: bool) -> None:
    """Print one line per bad sample (uncaptioned ones only when `list_uncaptioned`) and add to `counts`."""
    counts["total"] += report.samples
    listed = [
        ("corrupt", report.corrupt),
        ("too large", report.too_large),
        ("no caption", report.uncaptioned),
    ]
    for kind, samples in listed:
        counts[kind] += len(samples)
        if kind != "no caption" or list_uncaptioned:
            for key, reason in samples:
                print(f"{kind} {report.path} {key}: {reason}")
    if report.unreadable is not None:
        counts["unreadable"] += 1
        print(f"unreadable shard {report.path} ({report.samples} samples read): {report.unreadable}")
    elif report.empty:
        counts["empty"] += 1
        print(f"empty shard {report.path}: a valid tar without samples")


# name -> (add its arguments, run it, one-line help).
COMMANDS = {
    "synthscenes": (add_synthscenes_arguments, run_synthscenes, "render SynthScenes into webdataset shards"),
    "from-folder": (add_from_folder_arguments, run_from_folder, "pack a folder of images (+ .txt captions)"),
    "verify": (add_verify_arguments, run_verify, "decode every sample of shards and report corrupt ones"),
    "pretokenize": (add_pretokenize_arguments, run_pretokenize, "VQ-encode image shards at several sizes"),
    "ar-samples": (add_ar_samples_arguments, run_ar_samples, "shards of a model set's own AR samples"),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="mulo-data", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    for name, (add_arguments, _, summary) in COMMANDS.items():
        add_arguments(commands.add_parser(name, help=summary, description=summary))
    args = parser.parse_args(argv)
    return COMMANDS[args.command][1](args)


if __name__ == "__main__":
    sys.exit(main())
