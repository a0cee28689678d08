"""`mulo-data pretokenize`: VQ-encode the images of webdataset shards once, so AR training reads token grids.

    mulo-data pretokenize --shards "shards/synthscenes_128/train/synthscenes-{000000..000039}.tar" \\
        --tokenizer mulo_sd/assets/testbed/vq --sizes 128 64 32 --out shards/synthscenes_128_tokens/train

Each image is cropped and downscaled exactly as the training datamodule does it (its `SampleDecoder`: centre
crop to the largest size, box-filter area downscale of that crop to the others), then encoded at every size.
Each output sample keeps `__key__`, `txt` and `json` and adds one grid per size, `tok{h}.npy` (h = size /
the tokenizer's downsample factor; int16 when the codebook fits, else int32). Every input shard gives one
output shard of the same file name; `sizes.json` is written beside them. Corrupt samples are skipped,
warned about by key and counted in the summary.

With `--text-encoder DIR` (a FLAN-T5 folder, LlamaGen t2i) each sample also stores its caption's T5 features,
`t5.npy`: the valid token rows only, float32 [n, D] (LlamaGen's extract_t5_feature.py keeps the same rows),
so training does not run T5 every step; `mulo_sd.llamagen.t5.left_pad` turns a batch of them into the
features and
mask the GPT takes, exactly as `T5TextEncoder` returns them.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
import webdataset as wds
from mulo_sd.data.generated import GrowingData, ensure_generated
from mulo_sd.data.shards import SIZES_NAME, update_sizes, write_tar
from tqdm import tqdm

from mulo_sd.llamagen.t5 import FEATURES_MEMBER, T5_MAX_LENGTH, T5TextEncoder, t5_fingerprint
from mulo_sd.nets.dtypes import resolve_dtype
from mulo_sd.nets.io import CONFIG_NAME, WEIGHTS_NAME
from mulo_sd.nets.vq import VQModel

MANIFEST_NAME = "pretokenize.json"
KEPT_MEMBERS = ("txt", "json")


def token_key(size: int, downsample_factor: int) -> str:
    """Name of the grid member of images of `size` px, e.g. 'tok16' for 128 px at downsample factor 8."""
    return f"tok{size // downsample_factor}"


def check_sizes(sizes: list[int], downsample_factor: int) -> list[int]:
    """Distinct positive sizes divisible by the downsample factor, largest first."""
    sizes = [int(size) for size in sizes]
    bad = [size for size in sizes if size < downsample_factor or size % downsample_factor]
    if not sizes or bad or len(set(sizes)) != len(sizes):
        raise ValueError(
            f"sizes must be distinct multiples of the tokenizer's downsample factor {downsample_factor}, "
            f"got {sizes}"
        )
    return sorted(sizes, reverse=True)


def output_spec(shards_spec: str, out: str) -> str:
    """The input spec with each '::'-separated part's directory replaced by `out` (file names are kept)."""
    parts = []
    for part in shards_spec.split("::"):
        directory, name = os.path.split(part)
        if "{" in directory:
            raise ValueError(
                f"shard spec {part!r} has braces in its directory: pretokenize writes every shard into one "
                "folder by file name, so only the file name may vary"
            )
        parts.append(os.path.join(out, name))
    return "::".join(parts)


def tokenizer_hash(folder: str | Path) -> str:
    """sha256 of the tokenizer folder's config and weights: identifies the model that made the tokens."""
    digest = hashlib.sha256()
    for name in (CONFIG_NAME, WEIGHTS_NAME):
        path = Path(folder) / name
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found: --tokenizer must be a VQ folder written by export")
        digest.update(name.encode())
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()


def npy_bytes(grid: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, grid, allow_pickle=False)
    return buffer.getvalue()


def read_samples(path: str) -> Iterator[dict]:
    """Raw samples of one shard in order; a truncated tar ends early with a warning."""
    return iter(
        wds.DataPipeline(wds.SimpleShardList([path]), wds.tarfile_to_samples(handler=wds.warn_and_continue))
    )


def expected_samples(paths: list[str]) -> int | None:
    """Total from the inputs' sizes.json files when every shard is listed (for the progress bar)."""
    total = 0
    for path in paths:
        sizes_file = os.path.join(os.path.dirname(path), SIZES_NAME)
        if not os.path.isfile(sizes_file):
            return None
        with open(sizes_file) as f:
            count = json.load(f).get(os.path.basename(path))
        if count is None:
            return None
        total += count
    return total


class ShardTokenizer:
    """Decodes raw samples like the datamodule, encodes them in batches, and writes token samples."""

    def __init__(
        self,
        vq: VQModel,
        sizes: list[int],
        batch_size: int,
        device: str | torch.device,
        text_encoder: T5TextEncoder | None = None,
    ):
        # the datamodule's own decoder, so images are cropped and downscaled exactly as training does it
        # (imported here: it pulls in Lightning, which the other mulo-data commands do without)
        from mulo_sd.training.sample_decoding import SampleDecoder

        self.vq = vq
        self.text_encoder = text_encoder
        self.batch_size = batch_size
        self.device = torch.device(device)
        self.dtype = np.int16 if vq.codebook_size <= np.iinfo(np.int16).max + 1 else np.int32
        self.decoder = SampleDecoder(
            image_size=sizes[0],
            extra_sizes=tuple(sizes[1:]),
            token_shapes={},
            load_images=True,
            caption_key="txt",
        )
        # the datamodule's batch keys: the largest size is "image", the others "image_{px}"
        self.image_keys = {size: "image" if i == 0 else f"image_{size}" for i, size in enumerate(sizes)}

    @property
    def skipped(self) -> int:
        return self.decoder.skipped

    def encode(self, batch: list[tuple[dict, dict]]) -> Iterator[dict]:
        grids = {}
        for size, name in self.image_keys.items():
            images = torch.stack([decoded[name] for _, decoded in batch]).to(self.device)
            grids[size] = self.vq.encode(images).cpu().numpy().astype(self.dtype)
        captions = None
        if self.text_encoder is not None:  # the valid T5 rows, as LlamaGen's extract_t5_feature.py keeps
            captions = self.text_encoder.valid_rows([decoded["caption"] for _, decoded in batch])
        for i, (raw, _) in enumerate(batch):
            sample = {"__key__": raw["__key__"]}
            sample.update({member: raw[member] for member in KEPT_MEMBERS if member in raw})
            for size, grid in grids.items():
                sample[f"{token_key(size, self.vq.downsample_factor)}.npy"] = npy_bytes(grid[i])
            if captions is not None:
                sample[FEATURES_MEMBER] = npy_bytes(captions[i].float().cpu().numpy())
            yield sample

    def tokenize_shard(self, path: str, out_path: str, progress: tqdm) -> int:
        """Write the token samples of shard `path` to `out_path` (renamed into place when complete)."""
        return write_tar(out_path, self.token_samples(path, progress))

    def token_samples(self, path: str, progress: tqdm) -> Iterator[dict]:
        batch = []
        for raw in read_samples(path):
            decoded = self.decoder(raw)
            progress.update(1)
            if decoded is not None:
                batch.append((raw, decoded))
            if len(batch) == self.batch_size:
                yield from self.encode(batch)
                batch = []
        if batch:
            yield from self.encode(batch)


def pretokenize(
    shards_spec: str,
    tokenizer: str | Path,
    sizes: list[int],
    out: str,
    batch_size: int = 64,
    device: str | torch.device = "cpu",
    allow_pipe: bool = False,
    *,
    text_encoder: str | Path | None = None,
    text_dtype: str = "float32",
    text_max_length: int = T5_MAX_LENGTH,
) -> tuple[str, int, int]:
    """Tokenize every shard of `shards_spec` into `out`; returns (output spec, samples written, skipped).

    `allow_pipe` accepts `pipe:` input URLs, which run shell commands. `text_encoder`: a FLAN-T5 folder;
    each sample then also stores its caption's T5 features (mulo_sd/llamagen/t5.py)."""
    from mulo_sd.training.shard_stream import expand_shards  # training's spec syntax ('::' joins specs)

    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    paths = expand_shards(shards_spec, allow_pipe)
    names = [os.path.basename(path) for path in paths]
    if len(set(names)) != len(names):
        raise ValueError(
            f"{shards_spec!r} has shards with the same file name; they would overwrite each other"
        )
    spec = output_spec(shards_spec, out)
    vq = VQModel.from_pretrained(tokenizer, device)
    text = None if text_encoder is None else T5TextEncoder(text_encoder, device, text_dtype, text_max_length)
    shard_tokenizer = ShardTokenizer(vq, check_sizes(sizes, vq.downsample_factor), batch_size, device, text)
    os.makedirs(out, exist_ok=True)
    counts = {}
    with tqdm(total=expected_samples(paths), desc="pretokenize", unit="image") as progress:
        for path, name in zip(paths, names, strict=True):
            counts[name] = shard_tokenizer.tokenize_shard(path, os.path.join(out, name), progress)
    update_sizes(out, counts)
    return spec, sum(counts.values()), shard_tokenizer.skipped


def ensure_pretokenized(
    shards_spec: str,
    tokenizer: str | Path,
    sizes: list[int],
    out: str,
    batch_size: int = 64,
    device: str | torch.device = "cpu",
    *,
    text_encoder: str | Path | None = None,
    text_dtype: str = "float32",
    text_max_length: int = T5_MAX_LENGTH,
) -> str:
    """Pre-tokenize `shards_spec` into `out` unless it already holds exactly these tokens; return their spec.

    Training configs call this so token shards appear on demand. The manifest records the tokenizer (a hash
    of its config and weights), the sizes and, per token shard, the input shard it was made from; a folder
    made any other way is an error rather than silently reused (a retrained tokenizer needs fresh tokens).
    Input shards it has not seen (generated shards that grew) are tokenised and added; a smaller spec reuses
    the folder. Safe when several runs ask at once (one encodes, the others wait and reuse it; see
    data/generated.py)."""
    identity = {"tokenizer_sha256": tokenizer_hash(tokenizer), "sizes": [int(s) for s in sizes]}
    text = dict(text_encoder=text_encoder, text_dtype=text_dtype, text_max_length=text_max_length)
    if text_encoder is not None:  # the T5 folder's fingerprint and how captions were encoded
        identity["text_encoder"] = {
            "sha256": t5_fingerprint(text_encoder),
            "dtype": str(resolve_dtype(text_dtype)),
            "max_length": text_max_length,
        }
    inputs = TokenInputs(shards_spec, out)

    def encode(folder: str, made: dict | str | None) -> dict[str, str]:
        new = inputs.missing(made)  # a new folder gets the spec as given, so its errors name it
        source = shards_spec if made is None else "::".join(new.values())
        _, written, skipped = pretokenize(source, tokenizer, sizes, folder, batch_size, device, **text)
        print(f"pre-tokenized {written} images into {out} ({skipped} corrupt samples skipped)")
        return {**tokenized_inputs(made), **new}

    ensure_generated(out, GrowingData(MANIFEST_NAME, identity, "shards", inputs.covered_by, encode, "tokens"))
    return output_spec(shards_spec, out)


class TokenInputs:
    """The input shards of an `ensure_pretokenized` call, by token shard name, against a folder's record."""

    def __init__(self, shards_spec: str, out: str):
        urls = wds.shardlists.expand_urls(shards_spec)
        self.by_name = {os.path.basename(url): url for url in urls}
        self.out = out

    def covered_by(self, made: dict | str | None) -> bool:
        return not self.missing(made)

    def missing(self, made: dict | str | None) -> dict[str, str]:
        """The inputs a folder that tokenised `made` lacks; raises when it made one of their names from
        another input shard."""
        made = tokenized_inputs(made)
        for name, url in self.by_name.items():
            if made.get(name, url) != url:
                raise ValueError(
                    f"{self.out} holds {name} tokenised from {made[name]}, not from {url}: delete it or "
                    "change the output folder"
                )
        return {name: url for name, url in self.by_name.items() if name not in made}


def tokenized_inputs(made: dict | str | None) -> dict[str, str]:
    """{token shard name: input shard} from a manifest's "shards" (the input spec, before folders grew)."""
    if isinstance(made, str):
        return {os.path.basename(url): url for url in wds.shardlists.expand_urls(made)}
    return dict(made or {})


def add_pretokenize_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--shards", required=True, help="input image shards, e.g. dir/p-{000000..000009}.tar")
    parser.add_argument("--tokenizer", required=True, help="VQ folder (config.json + model.safetensors)")
    parser.add_argument(
        "--sizes", type=int, nargs="+", required=True, help="image sizes in px to encode, e.g. 128 64 32"
    )
    parser.add_argument("--out", required=True, help="output directory (shards keep their file names)")
    parser.add_argument("--batch-size", type=int, default=64, help="images per VQ encoder call")
    parser.add_argument("--device", default="cpu", help="torch device of the VQ (and T5) encoder")
    parser.add_argument(
        "--text-encoder",
        default=None,
        help=f"FLAN-T5 folder: also store each caption's T5 features ({FEATURES_MEMBER}; LlamaGen t2i)",
    )
    parser.add_argument("--text-dtype", default="float32", help="T5 dtype: float32, bf16 (LlamaGen) or fp16")
    parser.add_argument(
        "--text-max-length", type=int, default=T5_MAX_LENGTH, help="caption tokens kept (LlamaGen: 120)"
    )
    parser.add_argument(
        "--allow-pipe",
        action="store_true",
        help="accept pipe: shard URLs (webdataset runs them as shell commands)",
    )


def run_pretokenize(args: argparse.Namespace) -> int:
    try:
        spec, written, skipped = pretokenize(
            args.shards,
            args.tokenizer,
            args.sizes,
            args.out,
            args.batch_size,
            args.device,
            args.allow_pipe,
            text_encoder=args.text_encoder,
            text_dtype=args.text_dtype,
            text_max_length=args.text_max_length,
        )
    except (ValueError, FileNotFoundError) as error:
        raise SystemExit(f"mulo-data pretokenize: {error}") from None
    sizes = " ".join(str(size) for size in sorted(args.sizes, reverse=True))
    print(f"tokenized {written} images at {sizes} px; skipped {skipped} corrupt samples")
    print(spec)
    return 0
