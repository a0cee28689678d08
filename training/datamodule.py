"""Webdataset shards -> batches: a resampled training stream and a fixed validation set, for every trainer.

Training stream, built in each rank's main process and run inside every DataLoader worker:

    ResampledShards -> tar samples -> shuffle buffer -> decode (skip + count bad samples) -> batches
    -> with_epoch(batches_per_worker)

- Seeding. Shard choice and shuffle buffer are seeded by (seed, rank, worker, epoch), so ranks and workers see
  different data (that is the node/worker split of a resampled stream) and a run is reproducible for a fixed
  world size and worker count. The rank is resolved in the main process (explicit argument, the attached
  Trainer, or torch.distributed) and baked into the pipeline: a spawned worker has no process group to ask.
  The epoch is counted by each worker's copy of the pipeline, one pass per epoch; this needs the workers to
  persist across epochs (`persistent_workers`), otherwise each epoch would restart from a fresh copy at
  epoch 0 and repeat the previous epoch's data.
- Epoch length (equal on every rank, so DDP never waits for a rank that ran out):
      batches_per_rank   = ceil(train_samples_per_epoch / (batch_size * world_size))
      batches_per_worker = ceil(batches_per_rank / max(1, num_workers))
      an epoch is batches_per_worker * max(1, num_workers) batches per rank (the DataLoader's length), i.e.
      at least train_samples_per_epoch samples over all ranks. Batches are always full (partial=False).
- Resume. The datamodule's state (saved in every Lightning checkpoint) is the number of training batches
  consumed. A resumed run rebuilds the same stream and fast-forwards it: every worker starts at the epoch
  the run was in and drops the batches it had already delivered in that epoch, so the resumed run sees the
  batches the uninterrupted run would have seen. The DataLoader hands out batches round-robin starting at
  worker 0, so the order is exact when the checkpoint's batch count is a multiple of num_workers (keep
  checkpoint intervals even); otherwise the first round comes in another order (a warning says so).
  Lightning restores its epoch/batch counters and ends a resumed epoch at the usual length.

Validation set: the first `val_samples` samples of `val_shards` in shard order (no shuffling). Sample i goes
to rank i % world_size, and within a rank to worker j % num_workers (j counts that rank's samples), so ranks
never overlap and all get the same number of samples and batches. Each worker reads the raw bytes of all
those samples but decodes only its own.

Bad samples never stop training; broken data does. An undecodable image, bad json, a token grid of the wrong
shape or dtype, or a missing required member skips the sample with a rate-limited warning naming its key; a
truncated or unreadable tar is skipped from the point of failure with a warning (those samples are not
counted: their number is unknown). Each worker counts the samples it skipped; every batch carries that
worker's cumulative count as `batch["skipped"]` and the worker's index as `batch["worker"]`; `skipped_total`
sums the latest count of each worker. The resampled training stream never ends, so data without a usable
sample would spin forever: after `max_consecutive_failures` failures in a row (a skipped sample, or a shard
read without a single sample: a 0-byte file, an empty tar) with no sample decoded in between, the worker
raises an error naming the shards involved. A corrupt validation sample makes its rank's set one sample
smaller, which changes the batch count only if it empties a batch: keep validation shards clean.

Shard URLs: local paths, or anything webdataset opens (http://, gs://, ...). A `pipe:` URL is a shell
command that webdataset runs; such specs are refused unless `allow_pipe=True` (`data.allow_pipe=true`).

Everything in the pipeline is a module-level function, a functools.partial or a small class, so it pickles
for spawned workers and DDP.
"""

from __future__ import annotations

import copy
import functools
import io
import json
import math
import random
import re
import warnings
from collections.abc import Iterable
from pathlib import Path
from urllib.parse import urlparse

import lightning as L
import numpy as np
import torch
import webdataset as wds
from PIL import Image

IMAGE_MEMBERS = ("png", "jpg", "jpeg", "webp")  # the first one present is the sample's image
WARN_FIRST = 10  # warn for each of the first skipped samples of a worker, then at powers of two
URL_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")  # pipe:, http://, s3:// ... anything but a local path
# Large enough for a fully corrupt shard drawn through the shuffle buffer (about shard size + buffer size
# failures in a row at worst), small enough to stop within seconds on data that has no usable sample.
MAX_CONSECUTIVE_FAILURES = 20_000


def worker_id() -> int:
    """Index of the DataLoader worker running this code (0 in the main process)."""
    info = torch.utils.data.get_worker_info()
    return 0 if info is None else info.id


def warn_and_continue(error: Exception) -> bool:
    """Handler for unreadable tars: `wds.warn_and_continue` without its half-second sleep per error, which
    made a stream of broken shards crawl."""
    warnings.warn(repr(error), stacklevel=2)
    return True


def rank_worker_seed(rank: int) -> int:
    """`worker_seed` for ResampledShards: different for every (rank, worker)."""
    return wds.utils.make_seed(rank, worker_id())


class EpochShuffle(wds.PipelineStage):
    """Shuffle buffer seeded by (seed, rank, worker, epoch); the epoch counts the passes of this copy."""

    def __init__(self, bufsize: int, seed: int, rank: int, start_epoch: int = 0):
        self.bufsize = bufsize
        self.seed = seed
        self.rank = rank
        self.epoch = start_epoch - 1

    def run(self, src):
        self.epoch += 1
        rng = random.Random(wds.utils.make_seed(self.seed, self.rank, worker_id(), self.epoch))
        return wds.shuffle(self.bufsize, self.bufsize, rng=rng)(src)


class SkipConsumed(wds.PipelineStage):
    """Drop the batches this worker had already delivered before a resume (its first pass only)."""

    def __init__(self, per_worker: list[int]):
        self.per_worker = per_worker
        self.first_pass = True

    def run(self, src):
        skip = self.per_worker[worker_id()] if self.first_pass else 0
        self.first_pass = False
        for index, batch in enumerate(src):
            if index >= skip:
                yield batch


def center_crop(image: Image.Image, size: int) -> Image.Image:
    """Shortest side to `size` (box-halving large images first, then bicubic), then the centre square."""
    while min(image.size) >= 2 * size:
        image = image.resize((image.width // 2, image.height // 2), Image.Resampling.BOX)
    scale = size / min(image.size)
    image = image.resize((round(image.width * scale), round(image.height * scale)), Image.Resampling.BICUBIC)
    left, top = (image.width - size) // 2, (image.height - size) // 2
    return image.crop((left, top, left + size, top + size))


def to_tensor(image: Image.Image) -> torch.Tensor:
    """RGB PIL image -> float tensor [3, H, W] in [-1, 1]."""
    return torch.from_numpy(np.array(image, dtype=np.float32)).permute(2, 0, 1) / 127.5 - 1.0


class SampleDecoder:
    """Raw tar sample -> decoded sample, or None (skipped, counted, warned) when the sample is unusable.

    Also the batch collation function, so that each batch reports the count of the worker that made it.
    """

    def __init__(
        self,
        image_size: int,
        extra_sizes: tuple[int, ...],
        token_shapes: dict[str, tuple[int, int]],
        load_images: bool,
        caption_key: str,
        caption_features: str | None = None,
    ):
        self.image_size = image_size
        self.extra_sizes = extra_sizes
        self.token_shapes = token_shapes
        self.load_images = load_images
        self.caption_key = caption_key
        self.caption_features = caption_features
        self.skipped = 0  # each DataLoader worker counts in its own copy

    def __call__(self, sample: dict) -> dict | None:
        try:
            return self.decode(sample)
        except Exception as error:  # malformed bytes can raise almost anything from PIL, numpy or json
            self.skipped += 1
            if self.skipped <= WARN_FIRST or self.skipped & (self.skipped - 1) == 0:
                warnings.warn(
                    f"skipped sample {sample.get('__key__')!r} of {sample.get('__url__')}: "
                    f"{type(error).__name__}: {error} ({self.skipped} skipped by this worker so far; "
                    f"after {WARN_FIRST}, only every power of two is reported)",
                    stacklevel=1,
                )
            return None  # wds.map drops None results

    def decode(self, sample: dict) -> dict:
        caption = sample[self.caption_key].decode("utf-8").strip() if self.caption_key in sample else ""
        attributes = json.loads(sample["json"]) if "json" in sample else {}
        if not isinstance(attributes, dict):
            raise ValueError(f"json member is a {type(attributes).__name__}, expected an object")
        decoded = {"key": sample["__key__"], "caption": caption, "attributes": attributes}
        if self.load_images:
            member = next((name for name in IMAGE_MEMBERS if name in sample), None)
            if member is None:
                raise ValueError(f"missing image member (one of {', '.join(IMAGE_MEMBERS)})")
            with Image.open(io.BytesIO(sample[member])) as raw:
                image = center_crop(raw.convert("RGB"), self.image_size)
            decoded["image"] = to_tensor(image)
            for px in self.extra_sizes:
                decoded[f"image_{px}"] = to_tensor(image.resize((px, px), Image.Resampling.BOX))
        for name, shape in self.token_shapes.items():
            member = f"{name}.npy"
            if member not in sample:
                raise ValueError(f"missing member {member!r}")
            grid = np.load(io.BytesIO(sample[member]), allow_pickle=False)
            if grid.shape != shape or not np.issubdtype(grid.dtype, np.integer):
                raise ValueError(f"{member} is {grid.dtype} {grid.shape}, expected integers of shape {shape}")
            decoded[name] = torch.from_numpy(grid.astype(np.int64))
        if self.caption_features is not None:
            member = f"{self.caption_features}.npy"
            if member not in sample:
                raise ValueError(
                    f"missing member {member!r} (caption features: mulo-data pretokenize --text-encoder)"
                )
            rows = np.load(io.BytesIO(sample[member]), allow_pickle=False)
            if rows.ndim != 2 or not np.issubdtype(rows.dtype, np.floating):
                raise ValueError(f"{member} is {rows.dtype} {rows.shape}, expected floats of shape [n, D]")
            decoded[self.caption_features] = torch.from_numpy(rows.astype(np.float32))
        return decoded

    def collate(self, samples: list[dict]) -> dict:
        """Stack tensors, keep the rest (and the caption features, one [n_i, D] tensor per caption) as lists;
        add this worker's skipped count and index."""
        batch = {}
        for name, value in samples[0].items():
            if name.startswith("__"):  # wds.map copies __key__ back into each result
                continue
            values = [sample[name] for sample in samples]
            stack = isinstance(value, torch.Tensor) and name != self.caption_features
            batch[name] = torch.stack(values) if stack else values
        batch["skipped"] = torch.tensor(self.skipped)
        batch["worker"] = torch.tensor(worker_id())
        return batch


def skipped_total(batches: Iterable[dict]) -> int:
    """Samples skipped by one rank's workers while producing `batches` (the latest count of each worker).

    Counts are cumulative per worker since its dataset was built: over the run for the training stream
    (its workers persist), per pass for the validation set when it uses workers. For the whole job, sum
    over ranks, e.g. `self.log(..., reduce_fx="sum", sync_dist=True)`.
    """
    latest: dict[int, int] = {}
    for batch in batches:
        worker = int(batch["worker"])
        latest[worker] = max(latest.get(worker, 0), int(batch["skipped"]))
    return sum(latest.values())


class ConsecutiveFailures:
    """Failures of one worker's training stream since its last decoded sample; raises past `limit`.

    A failure is a skipped sample or a shard that yielded no sample. Without this bound a stream of
    resampled shards with nothing usable in them would loop forever without an error."""

    def __init__(self, limit: int):
        self.limit = limit
        self.skipped = 0
        self.empty_shards = 0
        self.shards: dict[str, None] = {}  # the shards of the current run of failures, in order

    def failed(self, url: str, empty_shard: bool = False) -> None:
        if empty_shard:
            self.empty_shards += 1
        else:
            self.skipped += 1
        self.shards[url] = None
        if self.skipped + self.empty_shards >= self.limit:
            shown = ", ".join(list(self.shards)[:5]) + (", ..." if len(self.shards) > 5 else "")
            raise RuntimeError(
                f"no usable training sample in {self.limit} tries in a row ({self.skipped} samples skipped, "
                f"{self.empty_shards} shards read without a sample) from {len(self.shards)} shard(s): "
                f"{shown}; check them with `mulo-data verify`, or raise data.max_consecutive_failures if the "
                "data has longer runs of corrupt samples"
            )

    def succeeded(self) -> None:
        if self.shards:
            self.skipped = self.empty_shards = 0
            self.shards.clear()


class ReadShards(wds.PipelineStage):
    """Shard URLs -> raw samples (a bad tar ends its shard with a warning); a shard without samples fails."""

    def __init__(self, failures: ConsecutiveFailures):
        self.failures = failures

    def run(self, src):
        for shard in src:
            empty = True
            for sample in wds.tarfile_to_samples(handler=warn_and_continue)([shard]):
                empty = False
                yield sample
            if empty:
                self.failures.failed(shard["url"], empty_shard=True)


class DecodeSamples(wds.PipelineStage):
    """Raw samples -> decoded samples, dropping (and counting as failures) those the decoder skips."""

    def __init__(self, decoder: SampleDecoder, failures: ConsecutiveFailures):
        self.decoder = decoder
        self.failures = failures

    def run(self, src):
        for sample in src:
            decoded = self.decoder(sample)
            if decoded is None:
                self.failures.failed(sample.get("__url__", "?"))
            else:
                self.failures.succeeded()
                yield decoded


def expand_shards(spec: str, allow_pipe: bool = False) -> list[str]:
    """Brace-expand a shard spec ('::' joins several); local files must exist, pipe: URLs need allow_pipe."""
    urls = wds.shardlists.expand_urls(spec)
    pipes = [url for url in urls if urlparse(url).scheme == "pipe"]
    if pipes and not allow_pipe:
        raise ValueError(
            f"shard spec {spec!r} has {len(pipes)} pipe: URLs, e.g. {pipes[0]!r}: webdataset runs each as a "
            "shell command. If you trust the spec, allow that with data.allow_pipe=true (training) or "
            "--allow-pipe (mulo-data pretokenize)"
        )
    missing = [url for url in urls if not URL_SCHEME.match(url) and not Path(url).is_file()]
    if missing:
        raise FileNotFoundError(
            f"{len(missing)} of {len(urls)} shards of {spec!r} do not exist, e.g. {missing[0]}; "
            "build them with the data/ scripts or fix the path"
        )
    return urls


class ShardDataModule(L.LightningDataModule):
    """Webdataset shards of images (and/or pre-tokenised grids) with captions and json attributes.

    Batch: "image" [B,3,S,S] in [-1,1] (when `load_images`), "image_{px}" for each of `extra_sizes` (the
    same crop area-downscaled), one int64 [B,h,w] grid per token key, "caption" list[str] ("" when
    missing), "attributes" list[dict] ({} when missing), "key" list[str], "skipped" and "worker" (see
    `skipped_total`).

    Token keys name npy members, "tok16" or "tok16.npy" -> batch key "tok16"; `token_shapes` gives the [h, w]
    of each (by batch key) so a grid of another shape is skipped instead of breaking a batch. `rank` and
    `world_size` override the rank found from the Trainer or torch.distributed (tests, custom launchers).

    `caption_features`: a member name, e.g. "t5": each sample's caption features "t5.npy" (float [n, D], the
    valid T5 rows `mulo-data pretokenize --text-encoder` stores) as batch["t5"], a list of [n_i, D] tensors
    (mulo_sd.llamagen.t5.left_pad makes the GPT's features and mask of them).

    `max_consecutive_failures`: a training worker raises after this many skipped samples or sample-less
    shards in a row (see the module docstring). `allow_pipe`: accept `pipe:` shard URLs, which run shell
    commands.
    """

    def __init__(
        self,
        train_shards: str,
        image_size: int,
        batch_size: int,
        train_samples_per_epoch: int,
        val_shards: str | None = None,
        val_samples: int | None = None,
        extra_sizes: Iterable[int] = (),
        token_keys: Iterable[str] = (),
        token_shapes: dict[str, Iterable[int]] | None = None,
        load_images: bool = True,
        num_workers: int = 0,
        shuffle_buffer: int = 1000,
        seed: int = 0,
        caption_key: str = "txt",
        caption_features: str | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        max_consecutive_failures: int = MAX_CONSECUTIVE_FAILURES,
        allow_pipe: bool = False,
    ):
        super().__init__()
        if not train_shards:
            raise ValueError("train_shards is empty: give a brace-expanded shard spec")
        for name, value in [
            ("image_size", image_size),
            ("batch_size", batch_size),
            ("train_samples_per_epoch", train_samples_per_epoch),
            ("max_consecutive_failures", max_consecutive_failures),
        ]:
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if val_samples is not None and val_samples < 1:
            raise ValueError(f"val_samples must be >= 1 or None (all samples), got {val_samples}")
        if num_workers < 0 or shuffle_buffer < 0:
            raise ValueError(
                f"num_workers and shuffle_buffer must be >= 0, got {num_workers}, {shuffle_buffer}"
            )
        extra_sizes = tuple(int(px) for px in extra_sizes)
        bad_sizes = [px for px in extra_sizes if not 0 < px < image_size]
        if bad_sizes:
            raise ValueError(
                f"extra_sizes must lie strictly between 0 and image_size={image_size}, got {bad_sizes}"
            )
        if extra_sizes and not load_images:
            raise ValueError("extra_sizes are downscaled images: they need load_images=True")
        token_shapes = dict(token_shapes or {})
        shapes = {}
        for key in token_keys:
            name = key.removesuffix(".npy")
            if name not in token_shapes or len(token_shapes[name]) != 2:
                raise ValueError(
                    f"token_shapes must give the [h, w] grid of token key {name!r}, got {token_shapes}"
                )
            shapes[name] = tuple(int(n) for n in token_shapes[name])
        if not load_images and not shapes:
            raise ValueError("nothing to load: set load_images=True or give token_keys")
        if (rank is None) != (world_size is None) or (world_size is not None and not 0 <= rank < world_size):
            raise ValueError(
                f"give both rank and world_size with 0 <= rank < world_size, got {rank}, {world_size}"
            )

        self.train_shards = train_shards
        self.val_shards = val_shards
        self.val_samples = val_samples
        self.batch_size = batch_size
        self.train_samples_per_epoch = train_samples_per_epoch
        self.num_workers = num_workers
        self.shuffle_buffer = shuffle_buffer
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.max_consecutive_failures = max_consecutive_failures
        self.allow_pipe = allow_pipe
        self.decoder = SampleDecoder(
            image_size, extra_sizes, shapes, load_images, caption_key, caption_features or None
        )
        self.resume_batches = 0  # training batches consumed before this run, from load_state_dict

    def rank_and_world_size(self) -> tuple[int, int]:
        if self.world_size is not None:
            return self.rank, self.world_size
        if self.trainer is not None:
            return self.trainer.global_rank, self.trainer.world_size
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            return torch.distributed.get_rank(), torch.distributed.get_world_size()
        return 0, 1

    def batches_per_worker(self, world_size: int) -> int:
        batches_per_rank = math.ceil(self.train_samples_per_epoch / (self.batch_size * world_size))
        return math.ceil(batches_per_rank / max(1, self.num_workers))

    def train_batches_per_epoch(self, world_size: int) -> int:
        """Batches each rank yields per epoch (the same on every rank)."""
        return self.batches_per_worker(world_size) * max(1, self.num_workers)

    def resume_point(self, world_size: int) -> tuple[int, list[int]]:
        """(epoch, batches each worker already delivered in it) after `resume_batches` consumed batches."""
        workers = max(1, self.num_workers)
        epoch, in_epoch = divmod(self.resume_batches, self.train_batches_per_epoch(world_size))
        if in_epoch % workers:
            warnings.warn(
                f"resuming after {self.resume_batches} batches, not a multiple of num_workers={workers}: "
                f"the first {workers} batches come in another order than in the uninterrupted run",
                stacklevel=2,
            )
        return epoch, [in_epoch // workers + (w < in_epoch % workers) for w in range(workers)]

    def train_dataset(self, rank: int, world_size: int) -> wds.DataPipeline:
        start_epoch, consumed = self.resume_point(world_size)
        decoder = copy.copy(self.decoder)  # its own skipped count, apart from the validation set's
        failures = ConsecutiveFailures(self.max_consecutive_failures)
        shards = wds.ResampledShards(
            expand_shards(self.train_shards, self.allow_pipe),
            seed=self.seed,
            worker_seed=functools.partial(rank_worker_seed, rank),
            deterministic=True,
        )
        shards.epoch = start_epoch - 1  # ResampledShards counts its passes from -1
        return wds.DataPipeline(
            shards,
            ReadShards(failures),
            # shuffle before decoding: raw bytes are small
            EpochShuffle(self.shuffle_buffer, self.seed, rank, start_epoch),
            DecodeSamples(decoder, failures),
            wds.batched(self.batch_size, collation_fn=decoder.collate, partial=False),
            SkipConsumed(consumed),
        ).with_epoch(self.batches_per_worker(world_size))

    def val_dataset(self, rank: int, world_size: int) -> wds.DataPipeline:
        if self.val_shards is None:
            raise ValueError("val_shards is not set: there is no validation set")
        if self.val_samples is None and world_size > 1:
            raise ValueError(
                "set val_samples when running on more than one rank, so every rank gets the same "
                "number of validation batches"
            )
        decoder = copy.copy(self.decoder)
        stages = [
            wds.SimpleShardList(expand_shards(self.val_shards, self.allow_pipe)),
            wds.tarfile_to_samples(handler=warn_and_continue),
        ]
        if self.val_samples is not None:
            # drop the remainder so every rank gets the same count; the node split is an explicit slice
            # because wds.split_by_node asks env/torch.distributed for the rank, which a spawned worker lacks
            stages += [
                wds.slice(self.val_samples // world_size * world_size),
                wds.slice(rank, None, world_size),
            ]
        stages += [
            wds.split_by_worker,
            wds.map(decoder),
            wds.batched(self.batch_size, collation_fn=decoder.collate, partial=True),
        ]
        return wds.DataPipeline(*stages)

    def train_dataloader(self) -> wds.WebLoader:
        rank, world_size = self.rank_and_world_size()
        loader = wds.WebLoader(
            self.train_dataset(rank, world_size),
            batch_size=None,
            shuffle=False,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
        )
        # a length lets Lightning end the epoch (also a resumed one) and size schedules
        return loader.with_length(self.train_batches_per_epoch(world_size), silent=True)

    def val_dataloader(self) -> wds.WebLoader | list:
        if self.val_shards is None:
            return []
        rank, world_size = self.rank_and_world_size()
        return wds.WebLoader(
            self.val_dataset(rank, world_size), batch_size=None, num_workers=self.num_workers
        )

    def state_dict(self) -> dict:
        consumed = self.resume_batches
        if self.trainer is not None:
            consumed = max(consumed, self.trainer.fit_loop.total_batch_idx + 1)
        return {"train_batches_consumed": consumed}

    def load_state_dict(self, state_dict: dict) -> None:
        self.resume_batches = int(state_dict["train_batches_consumed"])
