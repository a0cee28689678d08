"""The fewest images an FD is shown for (docs/statistics.md section 5, "How many images an FD needs").

Below `MIN_FD_IMAGES` images AR's FD moves between two seeds by as much as the goals' margins, so `fd`,
`fd_ratio` (with its interval) and `fd_ar` of such a row would read as results while they are noise: the
tables (`mulo_sd/evaluation/tables.py`, summary.md, matched.md) show "n/a (<N images)" in their place. The
CSVs keep the numbers, with `fd_min_images` (the minimum the row was held to) and `fd_below_minimum`.
"""

from __future__ import annotations

# AR's FD moves 6.5% between two seed pairs at 128 images; at 48 the same spread is about 11%, half the 20%
# margin of the goal "FD <= 1.2x AR's" (docs/statistics.md section 5)
MIN_FD_IMAGES = 48
FD_COLUMNS = ("fd", "fd_ratio", "fd_ar")
BELOW = "fd_below_minimum"
MINIMUM = "fd_min_images"


def mark_fd_minimum(entries: list[dict], minimum: int = MIN_FD_IMAGES) -> None:
    """Give every entry with an `fd` (summary and reference rows) `fd_min_images` and `fd_below_minimum`:
    whether its `images` (the run's decodes, prompts x seeds) are fewer than `minimum`."""
    for entry in entries:
        if "fd" in entry:
            entry[MINIMUM] = minimum
            entry[BELOW] = entry["images"] < minimum


def fd_note(minimum: int) -> str:
    """What a table shows instead of an FD of fewer than `minimum` images."""
    return f"n/a (<{minimum} images)"


def without_unsupported_fd(row: dict) -> dict:
    """`row`, or a copy whose FD columns (and the FD ratio's interval) read `fd_note` when it is below its
    minimum."""
    if not row.get(BELOW):
        return row
    shown = {key: value for key, value in row.items() if key not in ("fd_ratio_lo", "fd_ratio_hi")}
    for column in FD_COLUMNS:
        if shown.get(column) is not None:
            shown[column] = fd_note(row[MINIMUM])
    return shown
