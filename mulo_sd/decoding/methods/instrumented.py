"""Model wrappers that record every forward call of a decode into its DecodeStats, so that no method counts
calls by hand: each method wraps its models once (`Recorded`) and calls them as before. What a call adds to
which statistic is decided in one place, `DecodeStats.record_call` (docs/statistics.md section 1)."""

from __future__ import annotations

import functools

from mulo_sd.decoding.stats import DecodeStats

# the methods that run a model forward, per kind of model -> whether they are fed token ids, as
# `step(state, tokens [B, n], positions, ...)`; every other attribute is passed through unrecorded
AR_MODEL = {"start": False, "step": True, "step_tree": True}  # GPT, the Hugging Face adapter (no step_tree)
DRAFT_HEAD = {"step": False}  # EagleHead (fed features); its `start` only allocates its cache
UPSAMPLER = {"upsample_rows": False, "upsample_rows_logits": False}
DOWNSAMPLER = {"downsample": False}


class Recorded:
    """`model` as seen by a decoding method: each call of one of its `forwards` is recorded into `stats` as
    one call of `role`, with the image tokens it was fed (the ids' numel, summed over the batch; 0 for a
    forward fed no ids, e.g. `start`), and into the schedule `stats.calls` as ('<role>.<forward>', tokens
    fed), where a forward fed no ids counts what it was given (`_fed`)."""

    def __init__(self, model, role: str, stats: DecodeStats, forwards: dict[str, bool] = AR_MODEL):
        self._wrapped = model
        for name, fed_ids in forwards.items():
            if hasattr(model, name):
                setattr(self, name, _recording(getattr(model, name), name, role, stats, fed_ids))

    def __getattr__(self, name: str):
        return getattr(self._wrapped, name)


def _recording(method, name: str, role: str, stats: DecodeStats, fed_ids: bool):
    @functools.wraps(method)
    def call(*args, **kwargs):
        output = method(*args, **kwargs)
        tokens = (kwargs["tokens"] if "tokens" in kwargs else args[1]).numel() if fed_ids else 0
        stats.record_call(role, tokens, name, tokens if fed_ids else _fed(name, args, kwargs))
        return output

    return call


def _fed(name: str, args, kwargs) -> int:
    """What a forward fed no ids was given, for the call schedule: a draft head's `step(state, features
    [B', n, dim], ...)` counts its n positions (per internal row), an up-/down-sampler call its token grid
    (numel, summed over the batch); 0 for anything else (`start`)."""
    if name == "step":
        features = kwargs["features"] if "features" in kwargs else args[1]
        return int(features.shape[1])
    if name in ("upsample_rows", "upsample_rows_logits", "downsample"):
        grid = next((kwargs[key] for key in ("ids_low", "ids_high") if key in kwargs), None)
        return int((args[0] if grid is None else grid).numel())
    return 0
