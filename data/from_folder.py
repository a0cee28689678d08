"""`mulo-data from-folder`: pack a folder of images (and optional .txt captions) into shards.

The image bytes are stored as they are, under their extension. A file that does not decode as an image (a
0-byte file, a text file named .jpg, a truncated download) is skipped and named, and the count of skipped
files is printed; a caption file that is not UTF-8 stops the command. A non-empty --out is refused unless
--overwrite (out_folder.py), so the shards never mix with another dataset's.
"""

from __future__ import annotations

import argparse
import io
import os
from collections.abc import Iterator

from mulo_sd.data.out_folder import prepare_out_folder
from mulo_sd.data.shards import shard_spec, write_shards
from PIL import Image

# Image files from-folder accepts, and the webdataset extension each is stored under (bytes untouched).
FOLDER_IMAGE_EXTENSIONS = {".jpg": "jpg", ".jpeg": "jpg", ".png": "png", ".webp": "webp"}


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
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="delete the --prefix shards already in --out first (without it, a non-empty --out is refused)",
    )


def image_problem(data: bytes) -> str | None:
    """Why `data` is not a usable image (PIL's integrity check, then a full decode), or None."""
    if not data:
        return "empty file (0 bytes)"
    try:
        with Image.open(io.BytesIO(data)) as image:
            image.verify()
        with Image.open(io.BytesIO(data)) as image:  # verify() leaves the image unusable: decode a fresh one
            image.load()
    except Exception as error:  # malformed bytes can raise almost anything from PIL's decoders
        return f"{type(error).__name__}: {error}"
    return None


def image_paths(images_dir: str) -> list[str]:
    return sorted(
        os.path.join(root, name)
        for root, _, names in os.walk(images_dir)
        for name in names
        if os.path.splitext(name)[1].lower() in FOLDER_IMAGE_EXTENSIONS
    )


def folder_samples(images_dir: str, skipped: list[str]) -> Iterator[dict]:
    """Samples of every image under `images_dir` in sorted path order, keyed by relative path; the paths of
    files that do not decode are appended to `skipped` (and printed) instead.

    Dots in a path would split the webdataset key, so the key replaces them with underscores.
    """
    paths = image_paths(images_dir)
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
            data = f.read()
        problem = image_problem(data)
        if problem is not None:
            skipped.append(path)
            print(f"skipped {path}: not a usable image ({problem})")
            continue
        sample = {"__key__": key, FOLDER_IMAGE_EXTENSIONS[extension.lower()]: data}
        if os.path.exists(stem + ".txt"):
            try:
                with open(stem + ".txt", encoding="utf-8") as f:
                    sample["txt"] = f.read().strip().encode("utf-8")
            except UnicodeDecodeError as error:  # stop: a guessed encoding would store a garbled caption
                raise SystemExit(
                    f"mulo-data from-folder: caption {stem}.txt is not UTF-8 ({error}); re-save it as UTF-8"
                ) from None
        yield sample
    if len(skipped) == len(paths):
        raise SystemExit(
            f"mulo-data from-folder: none of the {len(paths)} image files under {images_dir} decodes"
        )


def run_from_folder(args: argparse.Namespace) -> int:
    if not os.path.isdir(args.images):
        raise SystemExit(f"mulo-data from-folder: --images {args.images} is not a directory")
    prepare_out_folder("from-folder", args.out, args.prefix, args.overwrite)
    skipped: list[str] = []
    sizes = write_shards(folder_samples(args.images, skipped), args.out, args.prefix, args.shard_size)
    print(f"wrote {sum(sizes.values())} images to {len(sizes)} shards; skipped {len(skipped)} files")
    print(shard_spec(args.out, sizes))
    return 0
