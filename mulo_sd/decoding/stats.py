"""The statistics record every decoding method (ar, zipar, lantern, eagle2, mulo) fills in, with exact
definitions.

Counts of model calls are per decode call (the batch shares one schedule). Token counts are summed over the
batch (divide by `batch_size` for per-image figures). The call counts, sequential_steps and tokens_evaluated
are recorded by the model wrappers of methods/instrumented.py (`record_call` holds the rule); the methods
count drafts, acceptances, islands and cycles themselves.

- batch_size: images decoded (adds up when records of several batches are merged with `add`).
- target_forwards: calls into the target model: `start` (the condition prefix) counts as one, every `step`
  as one, whatever the number of tokens or islands it carries.
- drafter_forwards: the same for the drafter model.
- upsampler_calls / downsampler_calls: calls of U_r / D_r (one call over any number of rows).
- sequential_steps: length of the critical path of model calls (target, drafter, up/down-sampler): calls
  that must wait for each other. Every call waits on the one before it (`record_call`), so it is the sum of
  the four call counts; for `ar` and `zipar` it equals target_forwards.
- tokens_drafted: draft tokens proposed for verification by the target.
- tokens_accepted / tokens_rejected: draft tokens that passed / failed the accept rule.
- tokens_resampled: grid positions the target sampled again after a rejection (islands, or the raster tail).
- tokens_evaluated: image tokens fed through the target's `step` in total (query tokens; stand-ins and
  rewrites included, the condition prefix not). tokens_evaluated / batch_size / target_forwards is the mean
  number of tokens evaluated in parallel per image.
- cycles: draft-verify cycles (0 for methods without a drafter).
- islands_per_cycle: number of rejection islands in each cycle; island_sizes: the size of every island, in
  the order they were found.
- accepted_per_cycle: draft tokens kept in each cycle of a tree method (eagle2); its mean plus one is
  EAGLE's mean accepted length (tokens committed per target verification).
- tokens_padding: entries fed to a stateful model (target, drafter) for nothing in a batched call: rows
  padded to the longest row of a `step_rows`, and idle rows (methods/lockstep.py). 0 for a decode of one
  image and for methods that give every row the same positions (ar, zipar).
- idle_rows: rows of batched stateful calls whose image asked nothing of that model in that call.
- per_image: in a batched (lockstep) decode, each image's own record, its calls counted as if it were decoded
  alone (its own sequential_steps); empty otherwise. The batch's call counts and sequential_steps are the
  batched calls: the batch's critical path, that of its slowest image or longer (docs/batching.md).
- phase_seconds: wall time per named phase (`with stats.phase("verify"): ...`), summed over entries.
- calls: the call schedule, one (kind, tokens fed) per recorded model call in the order of the calls (its
  length is sequential_steps). kind is '<role>.<forward>' (e.g. 'target.start', 'target.step',
  'target.step_tree', 'drafter.step', 'upsampler.upsample_rows', 'downsampler.downsample'; the bare role when
  the caller names no forward); tokens fed is what the model was given, summed over the batch: ids for a
  `start`-ed model's steps (0 for `start`), features for a draft head (their count of positions), the
  token grid passed to an up-/down-sampler. Kept for the cost model (mulo_sd/evaluation/cost_model.py), not
  a CSV column: `as_dict` leaves it out, `add` concatenates.
- wall_seconds: wall time of token generation (`with stats.wall(): ...`); the tokenizer's image decode,
  the same for every method, is left out of it and timed as phase "image".
CUDA work is synchronised at the edges of every timed block when `device` is a CUDA device.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

import torch

COUNTS = (
    "batch_size",
    "target_forwards",
    "drafter_forwards",
    "upsampler_calls",
    "downsampler_calls",
    "sequential_steps",
    "tokens_drafted",
    "tokens_accepted",
    "tokens_rejected",
    "tokens_resampled",
    "tokens_evaluated",
    "cycles",
)
# counts of batched (lockstep) decodes only; in `as_dict` only for such records, so a single-image row keeps
# its columns
BATCH_COUNTS = ("tokens_padding", "idle_rows")
# model role -> the count of its calls
CALL_COUNTERS = {
    "target": "target_forwards",
    "drafter": "drafter_forwards",
    "upsampler": "upsampler_calls",
    "downsampler": "downsampler_calls",
}


@dataclass
class DecodeStats:
    batch_size: int = 1
    target_forwards: int = 0
    drafter_forwards: int = 0
    upsampler_calls: int = 0
    downsampler_calls: int = 0
    sequential_steps: int = 0
    tokens_drafted: int = 0
    tokens_accepted: int = 0
    tokens_rejected: int = 0
    tokens_resampled: int = 0
    tokens_evaluated: int = 0
    cycles: int = 0
    tokens_padding: int = 0
    idle_rows: int = 0
    islands_per_cycle: list[int] = field(default_factory=list)
    island_sizes: list[int] = field(default_factory=list)
    accepted_per_cycle: list[int] = field(default_factory=list)
    phase_seconds: dict[str, float] = field(default_factory=dict)
    wall_seconds: float = 0.0
    device: torch.device | None = field(default=None, repr=False, compare=False)
    per_image: list[DecodeStats] = field(default_factory=list, repr=False, compare=False)
    calls: list[tuple[str, int]] = field(default_factory=list, repr=False, compare=False)

    def record_call(self, role: str, tokens: int, kind: str | None = None, fed: int | None = None) -> None:
        """Count one model call (methods/instrumented.py records every call here; no method counts by hand).
        role: 'target', 'drafter', 'upsampler' or 'downsampler'; tokens: image tokens fed, summed over the
        batch (only the target's enter a statistic: tokens_evaluated). kind: the forward called ('start',
        'step', ...), fed: the tokens it was fed for the schedule `calls` (None: `tokens`).

        Every call waits on the call recorded before it: the methods issue one model call at a time, each
        built from what the calls before it returned (sampled tokens, drafts) or wrote into a cache, and a
        parallel pass is always one call (ZipAR's rows, MuLo-SD's islands), so each call is one step of the
        critical path."""
        counter = CALL_COUNTERS.get(role)
        if counter is None:
            raise ValueError(f"unknown model role '{role}'; one of {list(CALL_COUNTERS)}")
        setattr(self, counter, getattr(self, counter) + 1)
        if role == "target":
            self.tokens_evaluated += tokens
        self.sequential_steps += 1
        self.calls.append((role if kind is None else f"{role}.{kind}", tokens if fed is None else fed))

    def _sync(self) -> None:
        if self.device is not None and torch.device(self.device).type == "cuda":
            torch.cuda.synchronize(self.device)

    @contextlib.contextmanager
    def phase(self, name: str):
        """Add the wall time of the block to `phase_seconds[name]`."""
        self._sync()
        start = time.perf_counter()
        try:
            yield
        finally:
            self._sync()
            self.phase_seconds[name] = self.phase_seconds.get(name, 0.0) + time.perf_counter() - start

    @contextlib.contextmanager
    def wall(self):
        """Add the wall time of the block (the whole decode) to `wall_seconds`."""
        self._sync()
        start = time.perf_counter()
        try:
            yield
        finally:
            self._sync()
            self.wall_seconds += time.perf_counter() - start

    def add(self, other: DecodeStats) -> DecodeStats:
        """Merge `other` (e.g. the next batch) into this record in place: counts, lists and times add up."""
        for name in (*COUNTS, *BATCH_COUNTS):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.islands_per_cycle.extend(other.islands_per_cycle)
        self.island_sizes.extend(other.island_sizes)
        self.accepted_per_cycle.extend(other.accepted_per_cycle)
        self.per_image.extend(other.per_image)
        self.calls.extend(other.calls)
        for name, seconds in other.phase_seconds.items():
            self.phase_seconds[name] = self.phase_seconds.get(name, 0.0) + seconds
        self.wall_seconds += other.wall_seconds
        return self

    def as_dict(self) -> dict[str, int | float | str]:
        """One flat row for a CSV: every count, island summaries, `time_<phase>_s` and `wall_s`."""
        row: dict[str, int | float | str] = {name: getattr(self, name) for name in COUNTS}
        if self.per_image:
            row.update({name: getattr(self, name) for name in BATCH_COUNTS})
            row["image_sequential_steps_max"] = max(image.sequential_steps for image in self.per_image)
        row["islands"] = len(self.island_sizes)
        row["island_size_mean"] = (
            sum(self.island_sizes) / len(self.island_sizes) if self.island_sizes else 0.0
        )
        row["island_size_max"] = max(self.island_sizes, default=0)
        row["islands_per_cycle"] = " ".join(map(str, self.islands_per_cycle))
        accepted = self.accepted_per_cycle  # empty, not 0, for methods without draft-tree cycles
        row["accepted_per_cycle_mean"] = sum(accepted) / len(accepted) if accepted else ""
        for name, seconds in sorted(self.phase_seconds.items()):
            row[f"time_{name}_s"] = seconds
        row["wall_s"] = self.wall_seconds
        return row
