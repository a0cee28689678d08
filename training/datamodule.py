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

Bad samples are skipped and counted (sample_decoding.py); broken data stops a training worker, and shard
specs are checked and `pipe:` URLs refused unless allowed (shard_stream.py). A corrupt validation sample makes
its rank's set one sample smaller, which changes the batch count only if it empties a batch: keep validation
shards clean.

Everything in the pipeline is a module-level function, a functools.partial or a small class, so it pickles
for spawned workers and DDP.
"""

from __future__ import annotations

import copy
import functools
import math
import warnings
from collections.abc import Iterable

import lightning as L
import torch
import webdataset as wds
from mulo_sd.data.image_limits import DEFAULT_MAX_ASPECT_RATIO, DEFAULT_MAX_PIXELS, ImageLimits
from mulo_sd.training.sample_decoding import captions_required, sample_decoder
from mulo_sd.training.shard_stream import (
    MAX_CONSECUTIVE_FAILURES,
    ConsecutiveFailures,
    DecodeSamples,
    EpochShuffle,
    ReadShards,
    SkipConsumed,
    expand_shards,
    rank_worker_seed,
    warn_and_continue,
)


def check_stream_settings(
    train_shards: str,
    positive: dict[str, int],
    val_samples: int | None,
    num_workers: int,
    shuffle_buffer: int,
) -> None:
    """A training shard spec, the settings in `positive` (name -> value) >= 1, val_samples >= 1 or None,
    num_workers and shuffle_buffer >= 0."""
    if not train_shards:
        raise ValueError("train_shards is empty: give a brace-expanded shard spec")
    for name, value in positive.items():
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if val_samples is not None and val_samples < 1:
        raise ValueError(f"val_samples must be >= 1 or None (all samples), got {val_samples}")
    if num_workers < 0 or shuffle_buffer < 0:
        raise ValueError(f"num_workers and shuffle_buffer must be >= 0, got {num_workers}, {shuffle_buffer}")


def check_rank(rank: int | None, world_size: int | None) -> None:
    if (rank is None) != (world_size is None) or (world_size is not None and not 0 <= rank < world_size):
        raise ValueError(
            f"give both rank and world_size with 0 <= rank < world_size, got {rank}, {world_size}"
        )


def samples_read(trainer: dict, batch_size: int) -> int | None:
    """Training samples a run reads over all ranks: max_steps x batch_size x accumulate_grad_batches x
    devices x num_nodes of its trainer config; None when unknown (no max_steps, devices "auto" or -1), which
    generated data (data/synthscenes_cache.py) takes as all of it."""
    devices = trainer.get("devices", 1)
    if isinstance(devices, list | tuple):
        devices = len(devices)
    steps = trainer.get("max_steps") or -1
    if not str(devices).isdigit() or int(devices) < 1 or steps < 1:
        return None
    ranks = int(devices) * trainer.get("num_nodes", 1)
    return steps * batch_size * trainer.get("accumulate_grad_batches", 1) * ranks


class ShardDataModule(L.LightningDataModule):
    """Webdataset shards of images (and/or pre-tokenised grids) with captions and json attributes.

    Batch: "image" [B,3,S,S] in [-1,1] (when `load_images`), "image_{px}" for each of `extra_sizes` (the
    same crop area-downscaled), one int64 [B,h,w] grid per token key, "caption" list[str] ("" when
    missing), "attributes" list[dict] ({} when missing), "key" list[str], "skipped" and "worker" (see
    `sample_decoding.skipped_total`).

    Token keys name npy members, "tok16" or "tok16.npy" -> batch key "tok16"; `token_shapes` gives the [h, w]
    of each (by batch key) so a grid of another shape is skipped instead of breaking a batch. `rank` and
    `world_size` override the rank found from the Trainer or torch.distributed (tests, custom launchers).

    `caption_features`: a member name, e.g. "t5": each sample's caption features "t5.npy" (float [n, D], the
    valid T5 rows `mulo-data pretokenize --text-encoder` stores) as batch["t5"], a list of [n_i, D] tensors
    (mulo_sd.llamagen.t5.left_pad makes the GPT's features and mask of them).

    `max_consecutive_failures`: a training worker raises after this many skipped samples or sample-less
    shards in a row (see the module docstring). `allow_pipe`: accept `pipe:` shard URLs, which run shell
    commands. `max_pixels`, `max_aspect_ratio`: larger or more elongated images are skipped, read from their
    header only (data/image_limits.py). `require_captions`: skip samples without a caption; None
    asks the LightningModule being trained (its `requires_captions`, False when it has none).
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
        max_pixels: int = DEFAULT_MAX_PIXELS,
        max_aspect_ratio: float = DEFAULT_MAX_ASPECT_RATIO,
        require_captions: bool | None = None,
    ):
        super().__init__()
        positive = {
            "image_size": image_size,
            "batch_size": batch_size,
            "train_samples_per_epoch": train_samples_per_epoch,
            "max_consecutive_failures": max_consecutive_failures,
        }
        check_stream_settings(train_shards, positive, val_samples, num_workers, shuffle_buffer)
        self.decoder = sample_decoder(
            image_size,
            extra_sizes,
            token_keys,
            token_shapes,
            load_images,
            caption_key,
            caption_features,
            ImageLimits(max_pixels, max_aspect_ratio),
        )
        check_rank(rank, world_size)

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
        self.require_captions = require_captions
        self.resume_batches = 0  # training batches consumed before this run, from load_state_dict

    def rank_and_world_size(self) -> tuple[int, int]:
        if self.world_size is not None:
            return self.rank, self.world_size
        if self.trainer is not None:
            return self.trainer.global_rank, self.trainer.world_size
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            return torch.distributed.get_rank(), torch.distributed.get_world_size()
        return 0, 1

    def trained_module(self) -> L.LightningModule | None:
        return self.trainer.lightning_module if self.trainer is not None else None

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
        decoder.require_captions = captions_required(self.require_captions, self.trained_module())
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
        decoder.require_captions = captions_required(self.require_captions, self.trained_module())
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
        loader = wds.WebLoader(
            self.val_dataset(rank, world_size), batch_size=None, num_workers=self.num_workers
        )
        batches = self.val_batches_per_rank(world_size)
        # a length gives the validation progress bar its total; an upper bound, so no batch is cut off
        return loader if batches is None else loader.with_length(batches, silent=True)

    def val_batches_per_rank(self, world_size: int) -> int | None:
        """Validation batches each rank yields with `val_samples` set (None without): every worker batches
        its share of the rank's samples on its own, the last batch partial. Fewer when the shards hold fewer
        samples or a sample is corrupt."""
        if self.val_samples is None:
            return None
        samples = self.val_samples // world_size
        workers = max(1, self.num_workers)
        shares = [samples // workers + (w < samples % workers) for w in range(workers)]
        return sum(math.ceil(share / self.batch_size) for share in shares)

    def state_dict(self) -> dict:
        consumed = self.resume_batches
        if self.trainer is not None:
            consumed = max(consumed, self.trainer.fit_loop.total_batch_idx + 1)
        return {"train_batches_consumed": consumed}

    def load_state_dict(self, state_dict: dict) -> None:
        self.resume_batches = int(state_dict["train_batches_consumed"])
