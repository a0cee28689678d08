"""Batched decoding of methods written for one image: every image runs its own single-image decode, and the
model calls of all images are gathered into batched calls (docs/batching.md).

Each image's decode runs in a thread of its own, against proxies of the models. A proxy call hands the
request to the driver and blocks; once every unfinished image waits on a call, the driver issues one round:
per (model, kind of call) one batched call over the images that asked for it.
- `start`: one call over every image's condition (all images start together); the batched state gets one
  scratch slot (the padding slot of `step_rows`), and each image receives a view of its own rows of it.
- `step`: one `step` when every image feeds the same positions, else one `step_rows` with each row's own
  positions, padded to the longest; an image that asks nothing of that model this round feeds padding only
  (it idles). Padding writes only the scratch slot, which no real query sees.
- `upsample_rows` / `upsample_rows_logits` / `downsample` (stateless): one call per group of images with the
  same arguments' shape.

Exactness: each image's decode issues the calls it would issue alone, with its own generator, and each call
gives its rows what the call alone would (per-row attention masks, the padding unseen), so image b's tokens
equal decoding it alone under the same generator. The driver waits for every image before a round, so the
rounds and their order do not depend on thread timing.

Statistics: each image keeps its own record (its calls as if alone: `per_image`); the batch's record counts
the batched calls (target_forwards, sequential_steps, ...: the batch's critical path), `tokens_padding` (the
entries fed for padding and idle rows) and `idle_rows` (rows of a stateful call whose image asked nothing).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch

from mulo_sd.decoding.stats import DecodeStats
from mulo_sd.nets.slot_cache import PADDING, DecodeState

STATEFUL = ("start", "step")


def batchable(*models) -> bool:
    """Whether the stateful models offer per-row positions (`step_rows`), which lockstep decoding needs."""
    return all(hasattr(model, "step_rows") for model in models)


def decode_images(
    job: Callable, models: dict, batch: int, device, together: bool
) -> tuple[list, DecodeStats]:
    """Decode `batch` images with job(i, models) -> (image i's output, its DecodeStats): in lockstep when
    `together` (the images have generators of their own), there are several and every stateful model (one
    with `start`) is batchable, else one after another (the records merged with `DecodeStats.add`, as before
    batching existed). -> (outputs, statistics)."""
    stateful = [model for model in models.values() if hasattr(model, "start")]
    if batch == 1 or not together or not batchable(*stateful):
        outputs, stats = [], None
        for i in range(batch):
            output, image_stats = job(i, models)
            outputs.append(output)
            stats = image_stats if stats is None else stats.add(image_stats)
        return outputs, stats
    stats = DecodeStats(batch_size=batch, device=device)
    results = decode_lockstep([lambda proxies, i=i: job(i, proxies) for i in range(batch)], models, stats)
    outputs, per_image = zip(*results, strict=True)
    _add_image_records(stats, list(per_image))
    return list(outputs), stats


def _add_image_records(stats: DecodeStats, per_image: list[DecodeStats]) -> None:
    """Token counts, cycles and island lists add up over the images; a phase lasts as long as the longest
    image's (an image's phase includes its waits on the batched calls)."""
    for image in per_image:
        for name in ("tokens_drafted", "tokens_accepted", "tokens_rejected", "tokens_resampled", "cycles"):
            setattr(stats, name, getattr(stats, name) + getattr(image, name))
        stats.islands_per_cycle.extend(image.islands_per_cycle)
        stats.island_sizes.extend(image.island_sizes)
        stats.accepted_per_cycle.extend(image.accepted_per_cycle)
        for name, seconds in image.phase_seconds.items():
            stats.phase_seconds[name] = max(stats.phase_seconds.get(name, 0.0), seconds)
    stats.per_image = per_image


def decode_lockstep(jobs: list[Callable], models: dict, stats: DecodeStats) -> list:
    """Run `jobs` (one per image; job(proxies) -> its result, proxies: role -> proxy of models[role], None
    where the model is None) in lockstep; the batched calls are recorded into `stats`. -> the results."""
    driver = _Driver(models, len(jobs), stats)
    threads = [
        threading.Thread(target=driver.run_job, args=(image, job), daemon=True)
        for image, job in enumerate(jobs)
    ]
    with stats.wall():
        for thread in threads:
            thread.start()
        driver.serve()
        for thread in threads:
            thread.join()
    for error in driver.errors:
        if error is not None:
            raise error
    return driver.outputs


class _Proxy:
    """One image's view of a shared model: forward calls go to the driver, everything else to the model."""

    def __init__(self, driver: _Driver, image: int, role: str, model):
        self._driver, self._image, self._role, self._model = driver, image, role, model

    def __getattr__(self, name: str):
        return getattr(self._model, name)

    def start(self, cond, cfg_scale, cond_mask=None):
        return self._driver.ask(self._image, self._role, "start", (cond, cfg_scale, cond_mask))

    def step(self, state, tokens, positions):
        return self._driver.ask(self._image, self._role, "step", (tokens, positions))

    def upsample_rows(self, ids, first_row, **inputs):
        return self._driver.ask(self._image, self._role, "upsample_rows", (ids, first_row, inputs))

    def upsample_rows_logits(self, ids, first_row, **inputs):
        return self._driver.ask(self._image, self._role, "upsample_rows_logits", (ids, first_row, inputs))

    def downsample(self, ids):
        return self._driver.ask(self._image, self._role, "downsample", (ids, {}))


class _Driver:
    def __init__(self, models: dict, count: int, stats: DecodeStats):
        self.models, self.count, self.stats = models, count, stats
        self.states: dict[str, DecodeState] = {}
        self.lock = threading.Lock()
        self.ready = threading.Event()  # every unfinished image waits on a call
        self.answered = [threading.Event() for _ in range(count)]  # one event per image: no herd wake-ups
        self.pending: dict[int, tuple] = {}
        self.answers: dict[int, tuple] = {}
        self.finished = 0
        self.outputs: list = [None] * count
        self.errors: list[BaseException | None] = [None] * count

    def run_job(self, image: int, job: Callable) -> None:
        proxies = {
            role: None if model is None else _Proxy(self, image, role, model)
            for role, model in self.models.items()
        }
        try:
            with torch.inference_mode():
                self.outputs[image] = job(proxies)
        except BaseException as error:  # handed to the caller by decode_lockstep
            self.errors[image] = error
        finally:
            with self.lock:
                self.finished += 1
                self._check_ready()

    def _check_ready(self) -> None:  # under self.lock
        if len(self.pending) + self.finished == self.count:
            self.ready.set()

    def ask(self, image: int, role: str, kind: str, args: tuple):
        with self.lock:
            self.pending[image] = (role, kind, args)
            self._check_ready()
        self.answered[image].wait()
        self.answered[image].clear()
        with self.lock:
            ok, value = self.answers.pop(image)
        if not ok:
            raise value
        return value

    def serve(self) -> None:
        while True:
            self.ready.wait()
            with self.lock:
                self.ready.clear()
                if self.finished == self.count:
                    return
                requests, self.pending = dict(sorted(self.pending.items())), {}
            answers = {}
            with torch.inference_mode():
                for (role, kind), images in _groups(requests).items():
                    answers.update(self._answer(role, kind, {i: requests[i][2] for i in images}))
            with self.lock:
                self.answers.update(answers)
            for image in answers:
                self.answered[image].set()

    def _answer(self, role: str, kind: str, asks: dict[int, tuple]) -> dict[int, tuple]:
        try:
            handler = {"start": self._start, "step": self._step}.get(kind, self._stateless)
            return {image: (True, value) for image, value in handler(role, kind, asks).items()}
        except Exception as error:  # raised in every image that asked
            return {image: (False, error) for image in asks}

    def _start(self, role: str, kind: str, asks: dict[int, tuple]) -> dict[int, DecodeState]:
        if len(asks) != self.count or role in self.states:
            raise ValueError(f"lockstep decoding starts every image's {role} together, once")
        conds, scales, masks = zip(*asks.values(), strict=True)
        if len(set(scales)) != 1 or len({mask is None for mask in masks}) != 1:
            raise ValueError(f"the images of a batch must share the {role}'s guidance scale and mask kind")
        cond_mask = None if masks[0] is None else torch.cat(masks)
        state = self.models[role].start(torch.cat(conds), scales[0], cond_mask=cond_mask)
        state.add_tree_slots(1)  # the padding slot of step_rows
        self.stats.record_call(role, 0)
        self.states[role] = state
        return {image: _rows_view(state, image) for image in asks}

    def _step(self, role: str, kind: str, asks: dict[int, tuple]) -> dict[int, torch.Tensor]:
        model, state = self.models[role], self.states[role]
        positions = [asks[i][1].cpu() if i in asks else None for i in range(self.count)]
        device = state.written.device
        same = None not in positions and all(torch.equal(p, positions[0]) for p in positions)
        if same:
            tokens = torch.cat([asks[i][0].to(device) for i in range(self.count)])
            logits = model.step(state, tokens, positions[0].to(device))
        else:
            width = max(len(p) for p in positions if p is not None)
            grid = torch.full((self.count, width), PADDING, dtype=torch.long)
            tokens = torch.zeros(self.count, width, dtype=torch.long)
            for image, (fed, _) in asks.items():
                grid[image, : len(positions[image])] = positions[image]
                tokens[image, : len(positions[image])] = fed[0].cpu()
            logits = model.step_rows(state, tokens.to(device), grid.to(device))
            self.stats.tokens_padding += self.count * width - sum(len(p) for p in positions if p is not None)
            self.stats.idle_rows += self.count - len(asks)
        self.stats.record_call(role, sum(asks[i][0].numel() for i in asks))
        return {image: logits[image : image + 1, : len(positions[image])] for image in asks}

    def _stateless(self, role: str, kind: str, asks: dict[int, tuple]) -> dict[int, torch.Tensor]:
        """One call per group of images whose arguments have the same shape (and first row). Each ask is
        (ids, *the other arguments, what else an up-sampler reads as a dict: caption, hypothesis; {} for
        none); those are stacked like the ids."""
        groups: dict[tuple, list[int]] = {}
        for image, (ids, *rest, _) in asks.items():
            groups.setdefault((tuple(ids.shape), *rest), []).append(image)
        answers = {}
        for (_, *rest), images in groups.items():
            inputs = _stacked_inputs([asks[i][-1] for i in images])
            model = getattr(self.models[role], kind)
            output = model(torch.cat([asks[i][0] for i in images]), *rest, **inputs)
            self.stats.record_call(role, 0)
            answers.update({image: output[j : j + 1] for j, image in enumerate(images)})
        return answers


def _stacked_inputs(inputs: list[dict]) -> dict:
    """The images' up-sampler inputs (caption `cond` and `cond_mask`, `hypothesis`; {} for none) as one
    batch: each one's tensors concatenated, a None (no caption mask) kept."""
    return {
        name: None if inputs[0][name] is None else torch.cat([one[name] for one in inputs])
        for name in inputs[0]
    }


def _groups(requests: dict[int, tuple]) -> dict[tuple[str, str], list[int]]:
    """(role, kind) -> the images asking it, in the order of the first image asking each."""
    groups: dict[tuple[str, str], list[int]] = {}
    for image, (role, kind, _) in requests.items():
        groups.setdefault((role, kind), []).append(image)
    return groups


def _rows_view(state: DecodeState, image: int) -> DecodeState:
    """Image `image`'s rows of a batched state as a state of its own that shares the storage (internal rows
    image and batch + image under guidance), so what the image's decode marks in it reaches the batch."""
    batch = state.batch_size
    return DecodeState(
        keys=[k[image::batch] for k in state.keys],
        values=[v[image::batch] for v in state.values],
        written=state.written[image::batch],
        cfg_scale=state.cfg_scale,
        cond_len=state.cond_len,
        first_logits=state.first_logits[image : image + 1],
        first_hidden=None if state.first_hidden is None else state.first_hidden[image::batch],
        tree_slots=state.tree_slots,
    )
