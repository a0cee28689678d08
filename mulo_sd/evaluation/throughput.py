"""Throughput at batch size B: images per second of every method, side by side in one process
(`mulo-eval eval=throughput`, docs/batching.md).

For each B in `batch_sizes` and each run (method and knobs, the recommended ones by default), `batches`
batches of B prompts are decoded together (`decode_entry.decode` with one seed per image, so the speculative
methods run in lockstep: methods/lockstep.py), after one untimed warm-up decode of one image per run. A
batch is timed from the call to its images (the tokenizer's decode included: what a user waits for), and
its token generation alone (`token_*`: DecodeStats.wall_seconds, the same tokenizer decode left out). Per
(run, B): images per second, the ratio to AR's at the same B (`vs_ar`, the first run with method 'ar'), the
batch's sequential steps per batch and its slowest image's own, the entries fed for padding and idle rows
per image, and the peak memory of a batch above what was in use before it: CUDA `max_memory_allocated`, on
CPU the peak resident set size sampled every 2 ms (/proc/self/statm), which also counts the allocator's
caching. A compiled run (RunSpec.compile) warms up at every B instead, on a whole batch, since its graphs
compile per batch size: that untimed decode's seconds are its `compile_s` (compilation and one decode).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from mulo_sd.decoding.sampling import SamplerConfig
from mulo_sd.evaluation.runs import RunSpec
from mulo_sd.evaluation.tables import markdown_table
from mulo_sd.evaluation.writers import write_csv
from mulo_sd.pipeline.decode_entry import decode

COLUMNS = (
    "family", "label", "method", "batch_size", "images", "seconds", "images_per_s", "vs_ar",
    "token_images_per_s", "token_vs_ar",
    "steps_per_batch", "slowest_image_steps", "padding_per_image", "peak_memory_mb", "compile_s",
)  # fmt: skip


# methods whose batch rows share one schedule (each image's steps are the batch's)
SHARED_SCHEDULE = ("ar", "zipar")


@dataclass
class Measured:
    images: int = 0
    seconds: float = 0.0
    token_seconds: float = 0.0  # token generation only (DecodeStats.wall_seconds): no tokenizer decode
    steps: int = 0
    slowest_image_steps: int | None = 0  # None: not recorded (images decoded one after another: eagle2)
    padding: int = 0
    peak_bytes: int = 0
    compile_s: float | None = None  # a compiled run's warm-up at this batch size (None: an eager run)


def measure_throughput(
    models_of: dict[str, object],
    runs: list[RunSpec],
    captions: list[str],
    batch_sizes: list[int],
    batches: int,
    sampler: SamplerConfig,
    device: torch.device,
) -> list[dict]:
    """models_of: run label -> its loaded Models. -> one row per (run, B), COLUMNS. Batch j of size B holds
    captions[j * B : (j + 1) * B] (cycled when there are fewer); image i of a run decodes under seed i."""
    if not captions:
        raise ValueError("throughput needs at least one prompt (prompts.count)")
    if not any(run.method == "ar" and not run.compile for run in runs):
        raise ValueError(
            "throughput reports every method over eager AR's images per second: add a run of method 'ar'"
        )
    if min(batch_sizes) < 1:
        raise ValueError(f"throughput.batch_sizes must be >= 1, got {batch_sizes}")
    for run in runs:  # warm-up, untimed: allocations, kernels, the neighbour tables
        if not run.compile:
            _decode_batch(run, models_of[run.label], captions[:1], sampler, 0)
    rows = []
    for size in batch_sizes:
        per_run = {}
        for run in runs:
            compile_s = _warm_up(run, models_of[run.label], captions, size, sampler) if run.compile else None
            per_run[run.label] = _measure(run, models_of[run.label], captions, size, batches, sampler, device)
            per_run[run.label].compile_s = compile_s
        ar = next(per_run[run.label] for run in runs if run.method == "ar" and not run.compile)
        rows += [_row(run, size, per_run[run.label], ar) for run in runs]
    return rows


def _measure(run, models, captions, size, batches, sampler, device) -> Measured:
    measured = Measured()
    for j in range(batches):
        with _PeakMemory(device) as peak:
            start = time.perf_counter()
            result = _decode_batch(run, models, _batch(captions, j * size, size), sampler, j * size)
            measured.seconds += time.perf_counter() - start
        stats = result.stats
        measured.token_seconds += stats.wall_seconds
        measured.images += size
        measured.steps += stats.sequential_steps
        own = [image.sequential_steps for image in stats.per_image]
        if not own and (size == 1 or run.method in SHARED_SCHEDULE):
            own = [stats.sequential_steps]  # every row follows the one schedule
        measured.slowest_image_steps = None if not own else (measured.slowest_image_steps or 0) + max(own)
        measured.padding += stats.tokens_padding
        measured.peak_bytes = max(measured.peak_bytes, peak.bytes)
    return measured


def _warm_up(run: RunSpec, models, captions: list[str], size: int, sampler: SamplerConfig) -> float:
    """Seconds of one untimed decode of the first batch of `size`, in which a compiled run's graphs for
    that batch size compile."""
    start = time.perf_counter()
    _decode_batch(run, models, _batch(captions, 0, size), sampler, 0)
    return time.perf_counter() - start


def _decode_batch(run: RunSpec, models, captions: list[str], sampler: SamplerConfig, first_seed: int):
    seeds = list(range(first_seed, first_seed + len(captions)))
    return decode(run.method, models, captions, dict(run.knobs), sampler, seeds, compile=run.compile)


def _batch(captions: list[str], first: int, size: int) -> list[str]:
    return [captions[(first + i) % len(captions)] for i in range(size)]


def _row(run: RunSpec, size: int, measured: Measured, ar: Measured) -> dict:
    batches = measured.images // size
    rate, token_rate = measured.images / measured.seconds, measured.images / measured.token_seconds
    return {
        "family": run.family, "label": run.label, "method": run.method, "batch_size": size,
        "images": measured.images, "seconds": round(measured.seconds, 3),
        "images_per_s": round(rate, 3), "vs_ar": round(rate / (ar.images / ar.seconds), 2),
        "token_images_per_s": round(token_rate, 3),
        "token_vs_ar": round(token_rate / (ar.images / ar.token_seconds), 2),
        "steps_per_batch": round(measured.steps / batches, 1),
        "slowest_image_steps": (
            "" if measured.slowest_image_steps is None else round(measured.slowest_image_steps / batches, 1)
        ),
        "padding_per_image": round(measured.padding / measured.images, 1),
        "peak_memory_mb": round(measured.peak_bytes / 2**20, 1),
        "compile_s": "" if measured.compile_s is None else round(measured.compile_s, 1),
    }  # fmt: skip


class _PeakMemory:
    """Peak memory of a block above what was in use when it began (module docstring); `.bytes`."""

    def __init__(self, device: torch.device):
        self.device, self.bytes = torch.device(device), 0

    def __enter__(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.base = torch.cuda.memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            return self
        self.base = self.peak = _rss()
        self.done = threading.Event()
        self.sampler = threading.Thread(target=self._sample, daemon=True)
        self.sampler.start()
        return self

    def _sample(self) -> None:
        while not self.done.wait(0.002):
            self.peak = max(self.peak, _rss())

    def __exit__(self, *exc):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.bytes = torch.cuda.max_memory_allocated(self.device) - self.base
            return False
        self.done.set()
        self.sampler.join()
        self.bytes = max(self.peak, _rss()) - self.base
        return False


def _rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def write_throughput(rows: list[dict], out_dir: Path, command: str) -> dict[str, Path]:
    """Write the CSV, the markdown table with its command, and the plot into out_dir -> their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {kind: out_dir / f"throughput.{kind}" for kind in ("csv", "md", "png")}
    write_csv(files["csv"], rows)  # rows are _row's dicts: COLUMNS, in order
    table = markdown_table(rows, COLUMNS) if rows else ""
    files["md"].write_text(f"# Throughput\n\n    {command}\n\n{table}\n")
    _plot(rows, files["png"])
    return files


def _plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (rates, ratios) = plt.subplots(1, 2, figsize=(10, 4))
    for label in dict.fromkeys(row["label"] for row in rows):
        mine = [row for row in rows if row["label"] == label]
        sizes = [row["batch_size"] for row in mine]
        rates.plot(sizes, [row["images_per_s"] for row in mine], marker="o", label=label)
        ratios.plot(sizes, [row["vs_ar"] for row in mine], marker="o", label=label)
    for axis, name in ((rates, "images / second"), (ratios, "images / second over AR's")):
        axis.set_xscale("log", base=2)
        axis.set_xlabel("batch size B")
        axis.set_ylabel(name)
        axis.grid(alpha=0.3)
    rates.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
