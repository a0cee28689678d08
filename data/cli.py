"""`mulo-data`: build and check the webdataset shards that training reads.

    mulo-data synthscenes --out shards/synthscenes --count 50000 --seed 0 --size 128 --workers 2
    mulo-data from-folder --images my_photos/ --out shards/photos
    mulo-data verify "shards/synthscenes/synthscenes-{000000..000049}.tar"     (or a directory)
    mulo-data pretokenize --shards "shards/synthscenes/synthscenes-{000000..000049}.tar" \
        --tokenizer mulo_sd/assets/testbed/vq --sizes 128 64 32 --out shards/synthscenes_tokens

Every command that writes shards also writes `sizes.json` ({shard file name: sample count}, as open_clip
reads it) and prints the brace-expanded shard spec to give the training config. Each shard is written under a
temporary name and renamed when complete, so an interrupted run leaves no truncated shard behind.
`synthscenes` refuses a non-empty --out, where scenes of another seed would mix with the new ones:
`--overwrite` deletes its SynthScenes shards first, `--start-index` adds to shards of the same seed and size.
`from-folder` stops with an error naming a caption file that is not UTF-8. `verify` fails samples that have
neither an image nor a `.npy` token grid, and shards without samples.

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
import glob
import io
import json
import multiprocessing
import os
import re
import sys
from collections.abc import Iterator

import webdataset as wds
from mulo_sd.data.generated import ensure_generated
from mulo_sd.data.pretokenize import add_pretokenize_arguments, run_pretokenize
from mulo_sd.data.shards import SIZES_NAME, check_shard, expand_spec, shard_spec, update_sizes, write_shards
from tqdm import tqdm

from mulo_sd.testbed.synthscenes import MIN_SIZE, render_scene

SYNTHSCENES_PREFIX = "synthscenes"
SYNTHSCENES_MANIFEST = "synthscenes.json"  # written by ensure_synthscenes
SYNTHSCENES_SHARD = re.compile(rf"{SYNTHSCENES_PREFIX}-(\d+)\.tar")
# Image files from-folder accepts, and the webdataset extension each is stored under (bytes untouched).
FOLDER_IMAGE_EXTENSIONS = {".jpg": "jpg", ".jpeg": "jpg", ".png": "png", ".webp": "webp"}


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
    if args.count < 1 or args.workers < 1 or args.shard_size < 1:
        raise SystemExit("mulo-data synthscenes: --count, --workers and --shard-size must be >= 1")
    if args.size < MIN_SIZE:
        raise SystemExit(f"mulo-data synthscenes: --size must be >= {MIN_SIZE} px, got {args.size}")
    if args.start_index < 0 or args.start_index % args.shard_size:
        raise SystemExit(
            f"mulo-data synthscenes: --start-index must be a non-negative multiple of "
            f"--shard-size ({args.shard_size}), got {args.start_index}"
        )
    prepare_synthscenes_folder(args)
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
    entries = sorted(os.listdir(args.out)) if os.path.isdir(args.out) else []
    if not entries:
        return
    if args.overwrite:
        ours = glob.glob(os.path.join(glob.escape(args.out), f"{SYNTHSCENES_PREFIX}-*.tar*"))
        for path in [*ours, os.path.join(args.out, SYNTHSCENES_MANIFEST)]:
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
        if os.path.isfile(os.path.join(args.out, SIZES_NAME)):
            update_sizes(args.out, {})  # drops the deleted shards, keeps any other shards' entries
        return
    shards = synthscenes_shards(args.out)
    if args.start_index > 0 and shards and set(entries) <= {*shards, SIZES_NAME}:
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
        return
    raise SystemExit(
        f"mulo-data synthscenes: {args.out} is not empty ({len(entries)} entries, e.g. {entries[0]}): pass "
        "--overwrite to replace its SynthScenes, or --start-index to add scenes of the same --seed and --size"
    )


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


def ensure_synthscenes(out: str, count: int, seed: int, size: int, shard_size: int = 1000) -> str:
    """Generate SynthScenes shards in `out` unless that folder already holds exactly these; return the spec.

    Training configs call this so the testbed's data appears on demand. A folder made with other
    arguments is an error rather than silently reused. Safe when several runs ask at once (one renders,
    the others wait and reuse it; see data/generated.py)."""
    wanted = {"count": count, "seed": seed, "size": size, "shard_size": shard_size}

    def render(folder: str) -> None:
        args = argparse.Namespace(
            out=folder,
            count=count,
            seed=seed,
            size=size,
            shard_size=shard_size,
            workers=os.cpu_count() or 1,
            start_index=0,
            overwrite=False,
        )
        write_synthscenes(args)
        print(f"wrote {count} SynthScenes (seed {seed}, {size} px) to {out}")

    ensure_generated(out, SYNTHSCENES_MANIFEST, wanted, render, "SynthScenes")
    return shard_spec(out, [f"{SYNTHSCENES_PREFIX}-{i:06d}.tar" for i in range(-(-count // shard_size))])


def add_from_folder_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--images",
        required=True,
        help="folder searched recursively for jpg/jpeg/png/webp; a caption is the .txt file "
        "with the image's stem next to it (optional)",
    )
    parser.add_argument("--out", required=True, help="output directory for the shards and sizes.json")
    parser.add_argument("--shard-size", type=int, default=1000, help="samples per shard")
    parser.add_argument("--prefix", default="images", help="shard file name prefix")


def folder_samples(images_dir: str) -> Iterator[dict]:
    """Samples of every image under `images_dir` in sorted path order, keyed by relative path.

    Dots in a path would split the webdataset key, so the key replaces them with underscores.
    """
    paths = sorted(
        os.path.join(root, name)
        for root, _, names in os.walk(images_dir)
        for name in names
        if os.path.splitext(name)[1].lower() in FOLDER_IMAGE_EXTENSIONS
    )
    if not paths:
        raise SystemExit(f"mulo-data from-folder: no jpg/jpeg/png/webp images under {images_dir}")
    seen: dict[str, str] = {}
    for path in paths:
        stem, extension = os.path.splitext(path)
        key = os.path.relpath(stem, images_dir).replace(os.sep, "/").replace(".", "_")
        if key in seen:
            raise SystemExit(f"mulo-data from-folder: {seen[key]} and {path} map to the same key {key!r}")
        seen[key] = path
        with open(path, "rb") as f:
            sample = {"__key__": key, FOLDER_IMAGE_EXTENSIONS[extension.lower()]: f.read()}
        if os.path.exists(stem + ".txt"):
            try:
                with open(stem + ".txt", encoding="utf-8") as f:
                    sample["txt"] = f.read().strip().encode("utf-8")
            except UnicodeDecodeError as error:  # stop: a guessed encoding would store a garbled caption
                raise SystemExit(
                    f"mulo-data from-folder: caption {stem}.txt is not UTF-8 ({error}); re-save it as UTF-8"
                ) from None
        yield sample


def run_from_folder(args: argparse.Namespace) -> int:
    if not os.path.isdir(args.images):
        raise SystemExit(f"mulo-data from-folder: --images {args.images} is not a directory")
    sizes = write_shards(folder_samples(args.images), args.out, args.prefix, args.shard_size)
    print(f"wrote {sum(sizes.values())} images to {len(sizes)} shards")
    print(shard_spec(args.out, sizes))
    return 0


def add_verify_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", help="shard spec (dir/name-{000000..000009}.tar) or a directory")
    parser.add_argument(
        "--write-sizes",
        action="store_true",
        help="also write sizes.json (samples per readable shard) next to the shards",
    )


def run_verify(args: argparse.Namespace) -> int:
    try:
        paths = expand_spec(args.spec)
    except ValueError as error:
        raise SystemExit(f"mulo-data verify: {error}") from None
    total = corrupt = unreadable = empty = 0
    sizes_by_dir: dict[str, dict[str, int]] = {}
    for path in tqdm(paths, desc="verify", unit="shard"):
        report = check_shard(path)
        total += report.samples
        corrupt += len(report.corrupt)
        for key, reason in report.corrupt:
            print(f"corrupt {path} {key}: {reason}")
        if report.unreadable is not None:
            unreadable += 1
            print(f"unreadable shard {path} ({report.samples} samples read): {report.unreadable}")
        else:
            if report.empty:
                empty += 1
                print(f"empty shard {path}: a valid tar without samples")
            sizes_by_dir.setdefault(os.path.dirname(path), {})[os.path.basename(path)] = report.samples
    print(f"shards: {len(paths)}  unreadable shards: {unreadable}  empty shards: {empty}")
    print(f"total: {total}  ok: {total - corrupt}  corrupt: {corrupt}")
    if args.write_sizes:
        for directory, sizes in sizes_by_dir.items():
            update_sizes(directory, sizes)
    return 1 if corrupt or unreadable or empty else 0


# name -> (add its arguments, run it, one-line help).
COMMANDS = {
    "synthscenes": (add_synthscenes_arguments, run_synthscenes, "render SynthScenes into webdataset shards"),
    "from-folder": (add_from_folder_arguments, run_from_folder, "pack a folder of images (+ .txt captions)"),
    "verify": (add_verify_arguments, run_verify, "decode every sample of shards and report corrupt ones"),
    "pretokenize": (add_pretokenize_arguments, run_pretokenize, "VQ-encode image shards at several sizes"),
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
