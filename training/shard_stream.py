"""Shard specs and the stages of the datamodule's streams (datamodule.py) that read shards: the seeded shuffle
and the resume's skip per (rank, worker), tars to raw samples, raw samples to decoded ones.

Shard URLs: local paths, or anything webdataset opens (http://, gs://, ...). A `pipe:` URL is a shell
command that webdataset runs; such specs are refused unless `allow_pipe=True` (`data.allow_pipe=true`).

Broken data stops training, bad samples do not (sample_decoding.py). A truncated or unreadable tar is
skipped from the point of failure with a warning (those samples are not counted: their number is unknown).
The resampled training stream never ends, so data without a usable sample would spin forever: after
`max_consecutive_failures` failures in a row (a skipped sample, or a shard read without a single sample: a
0-byte file, an empty tar) with no sample decoded in between, the worker raises an error naming the shards
involved.

Each stage is a small class or a module-level function, so the pipelines pickle for spawned workers and DDP.
"""

from __future__ import annotations

import random
import re
import warnings
from pathlib import Path
from urllib.parse import urlparse

import webdataset as wds
from mulo_sd.training.sample_decoding import SampleDecoder, worker_id

URL_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")  # pipe:, http://, s3:// ... anything but a local path
# Large enough for a fully corrupt shard drawn through the shuffle buffer (about shard size + buffer size
# failures in a row at worst), small enough to stop within seconds on data that has no usable sample.
MAX_CONSECUTIVE_FAILURES = 20_000


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
