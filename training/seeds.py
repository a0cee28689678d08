"""Decode seeds as the commands take them (`mulo-decode seed`, `mulo-eval seeds` and `fd_ar.seeds`), checked
before any model loads: each decode seeds a torch.Generator with one, and manual_seed refuses a number past 64
bits ("Overflow when unpacking long long") only once the models have loaded. Negative seeds are refused too:
manual_seed wraps them onto large ones (-1 and 2**64 - 1 give the same images)."""

from __future__ import annotations

SEED_MAX = 2**63 - 1
SEED_RANGE = "[0, 2**63-1]"
WHY = f"a seed must be an integer in {SEED_RANGE} (0 to {SEED_MAX}), what each decode's torch.Generator takes"


def check_seed(value, knob: str) -> int:
    """`value`, after checking that it is an integer seed in SEED_RANGE; the error names `knob`."""
    if not _is_seed(value):
        raise ValueError(f"{knob}={value!r}: {WHY}")
    return value


def check_seeds(values, knob: str) -> list[int]:
    """The list of seeds `values` (None: none), each checked as check_seed does; the error names `knob`."""
    values = list(values or [])
    for value in values:
        if not _is_seed(value):
            raise ValueError(f"{knob}={values} holds {value!r}: {WHY}")
    return values


def _is_seed(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, int) and 0 <= value <= SEED_MAX
