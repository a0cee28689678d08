"""Checks of decode_mulo's knobs and models (methods/mulo.py): every bad setting is an error that names it."""

from __future__ import annotations

from mulo_sd.decoding.accept import ACCEPT_RULES

REJECTIONS = ("local", "naive", "raster")


def uses_downsampler(rejection: str, rows_per_cycle: int | None) -> bool:
    """Whether decode_mulo may call the down-sampler: 'raster' discards the drafts after t0 and a
    rows_per_cycle drafts part of the grid, so the next cycle drafts from down-sampled accepted rows."""
    return rejection == "raster" or rows_per_cycle is not None


def own_draft_temperature(upsampler) -> float:
    """The draft temperature an up-sampler's weights were shipped with (`config.draft_temperature`); 0 (the
    argmax) for one that has none, as the pixel path."""
    return float(getattr(getattr(upsampler, "config", None), "draft_temperature", 0.0))


def check_knobs(rejection, accept_rule, bars, l, windows, draft_temperature: float) -> None:
    """Raise unless the modes are known and the bars (tau, accept_floor), l and the windows (rows_per_cycle,
    draft_window, island_zipar_window) and draft_temperature lie in their ranges."""
    if rejection not in REJECTIONS:
        raise ValueError(f"rejection must be one of {REJECTIONS}, got '{rejection}'")
    if accept_rule not in ACCEPT_RULES:
        raise ValueError(f"accept_rule must be one of {ACCEPT_RULES}, got '{accept_rule}'")
    for name, value in zip(("tau", "accept_floor"), bars, strict=True):
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"{name} must lie in [0, 1] (a probability mass threshold), got {value}")
    if l < 0:
        raise ValueError(f"l must be >= 0 (the local expansion radius), got {l}")
    for name, value in zip(("rows_per_cycle", "draft_window", "island_zipar_window"), windows, strict=True):
        if value is not None and value < 1:
            raise ValueError(f"{name} must be None or >= 1, got {value}")
    if not draft_temperature >= 0.0:  # also NaN
        raise ValueError(
            f"draft_temperature must be >= 0 (0: the up-sampler's argmax), got {draft_temperature}"
        )


def check_models(
    target, drafter, upsampler, downsampler, rejection, rows_per_cycle, draft_temperature
) -> int:
    """Raise unless the models share a vocabulary and one scale r, with a down-sampler where the mode needs
    one (None: not given) and an up-sampler with logits where drafts are sampled; return r."""
    if draft_temperature > 0 and not hasattr(upsampler, "upsample_rows_logits"):
        raise ValueError(
            f"draft_temperature={draft_temperature} samples the draft from the up-sampler's logits, and "
            f"{type(upsampler).__name__} has none (the pixel path interpolates): use a learned up-sampler "
            f"or draft_temperature=0"
        )
    if downsampler is None and uses_downsampler(rejection, rows_per_cycle):
        raise ValueError(
            "rejection='raster' and rows_per_cycle draft from down-sampled accepted rows: give a downsampler "
            "(the default, one cycle with 'local' / 'naive' rejection, needs none)"
        )
    samplers = {"upsampler": upsampler, "downsampler": downsampler}
    samplers = {name: sampler for name, sampler in samplers.items() if sampler is not None}
    sizes = {
        "target": target.vocab_size,
        "drafter": drafter.vocab_size,
        **{name: sampler.codebook_size for name, sampler in samplers.items()},
    }
    if len(set(sizes.values())) != 1:
        raise ValueError(f"target, drafter, upsampler and downsampler must share one vocabulary, got {sizes}")
    (height, width), (low_height, low_width) = target.grid_size, drafter.grid_size
    if height % low_height or width % low_width or height // low_height != width // low_width:
        raise ValueError(
            f"target grid {height}x{width} must be the drafter grid {low_height}x{low_width} scaled by one "
            f"integer r in both directions"
        )
    r = height // low_height
    if any(sampler.r != r for sampler in samplers.values()):
        scales = " and ".join(f"{name} r={sampler.r}" for name, sampler in samplers.items())
        raise ValueError(
            f"{scales} must equal the grid ratio r={r} (target {height}x{width} / drafter "
            f"{low_height}x{low_width})"
        )
    return r
