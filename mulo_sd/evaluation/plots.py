"""The evaluations' figures (docs/evaluation.md section 6): speed_quality.png, speedup against quality per
run family, and the image grid.

speed_quality.png stays readable with many families: past `MAX_SERIES` families (curves no longer stay
apart on one colour cycle) it is faceted into panels that share the quality axis: the baselines (every
method but MuLo-SD, the reference AR among them) and MuLo-SD per scale r, each cut into panels of at most
`MAX_SERIES`; each panel spans its own speedups.
Each point carries the bootstrap intervals of its speedup and, where the summary has them (`<quality>_lo`,
`<quality>_hi`: the paired differences d_sceneeval, d_nll and the FD ratio), of its quality as error bars;
each panel's legend sits right of its axes, never over the data.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import torch

MAX_SERIES = 8
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")  # one per series of a panel, beside its colour
# the default quality axis, first one every entry has: the paired differences to AR come with intervals
DEFAULT_QUALITIES = ("d_sceneeval", "sceneeval", "d_nll", "nll_mean")
NO_QUALITY = "step_ratio_median"  # no quality measured (quality=False): steps against time instead
QUALITY_NAMES = {
    "d_sceneeval": "SceneEval - AR's (paired mean; higher is better)",
    "sceneeval": "SceneEval score (higher is better)",
    "d_nll": "target NLL - AR's (paired mean; lower is better)",
    "nll_mean": "target NLL of the tokens (lower is better)",
    "step_ratio_median": "sequential-step ratio over AR",
    "clip_score": "CLIP score (higher is better)",
    "fid": "FID (lower is better)",
    "fd_ratio": "FD / AR's FD (lower is better)",
}
BASELINES = "AR and the baselines"


def wrap(text: str, width: int) -> str:
    """`text` on lines of at most `width` characters, broken between words only (a longer word keeps its
    own line)."""
    return textwrap.fill(text, width, break_long_words=False, break_on_hyphens=False)


def default_quality(summary: list[dict]) -> str:
    """The first of DEFAULT_QUALITIES that every entry has, else NO_QUALITY."""
    for name in DEFAULT_QUALITIES:
        if all(entry.get(name) is not None for entry in summary):
            return name
    return NO_QUALITY


def speed_quality_panels(summary: list[dict]) -> dict[str, list[str]]:
    """Panel title -> its families, in order of first appearance (module docstring): one untitled panel
    when there are at most MAX_SERIES families."""
    families = list(dict.fromkeys(entry["family"] for entry in summary))
    if len(families) <= MAX_SERIES:
        return {"": families}
    groups: dict[str, list[str]] = {}
    for family in families:
        first = next(entry for entry in summary if entry["family"] == family)
        groups.setdefault(_group(first), []).append(family)
    panels = {}
    for title, members in groups.items():
        parts = [members[i : i + MAX_SERIES] for i in range(0, len(members), MAX_SERIES)]
        for number, part in enumerate(parts, 1):
            panels[title if len(parts) == 1 else f"{title} ({number}/{len(parts)})"] = part
    return panels


def _group(entry: dict) -> str:
    """The facet of a run: the baselines, or MuLo-SD at its r (from the run's own knobs where they name
    it)."""
    if entry["method"] != "mulo":
        return BASELINES
    knobs = entry.get("knobs") or {}
    r = (json.loads(knobs) if isinstance(knobs, str) else knobs).get("r")
    return "MuLo-SD" if r is None else f"MuLo-SD {r}x"


def speed_quality_figure(summary: list[dict], quality: str | None = None):
    """Speedup (x) against `quality` (y; None: `default_quality`), one curve per family over its sweep,
    faceted and with error bars as the module docstring says; -> a matplotlib Figure."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure  # the object API: no pyplot state, no display backend

    quality = quality or default_quality(summary)
    panels = speed_quality_panels(summary)
    figure = Figure(figsize=(10.5, 1.0 + 3.3 * len(panels)), layout="constrained")
    FigureCanvasAgg(figure)  # a renderer for the label extents (_separate_labels)
    column = figure.subplots(len(panels), 1, squeeze=False, sharey=True)[:, 0]  # own speed range each
    for axes, (title, families) in zip(column, panels.items(), strict=True):
        shown = [entry for entry in summary if entry["family"] in families]
        for family, marker in zip(families, MARKERS, strict=False):
            runs = [entry for entry in shown if entry["family"] == family]
            _draw_family(axes, runs, family, quality, marker)
        if min(entry["speedup_median"] for entry in shown) <= 1.0:  # AR's speed, where a panel reaches it
            axes.axvline(1.0, color="grey", linewidth=0.6)
        if quality.startswith("d_"):
            axes.axhline(0.0, color="grey", linewidth=0.6)
        axes.set_title(title, fontsize=9, loc="left")
        axes.set_ylabel(wrap(QUALITY_NAMES.get(quality, quality), 28), fontsize=8)
        axes.grid(alpha=0.3)
        axes.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    column[-1].set_xlabel("speedup over AR (median of per-prompt ratios); bars: 95% bootstrap intervals")
    _separate_labels(figure, column)
    return figure


def _separate_labels(figure, column) -> None:
    """Lift each point's setting label, a line at a time, until it overlaps no label of its panel placed
    before it (the settings of a dense cluster of points would print over each other)."""
    figure.draw_without_rendering()  # the final layout, so that the extents are the saved ones
    renderer = figure.canvas.get_renderer()
    for axes in column:
        placed = []
        for text in axes.texts:
            box = text.get_window_extent(renderer)
            while any(box.overlaps(other) for other in placed):
                x, y = text.xyann  # offset points
                text.xyann = (x, y + box.height * 72 / figure.dpi + 1)  # 1 pt apart
                box = text.get_window_extent(renderer)
            placed.append(box)


def _draw_family(axes, entries: list[dict], family: str, quality: str, marker: str) -> None:
    """One family's curve, its points sorted by speedup, with error bars (fainter than the curve) and each
    point's setting."""
    entries = sorted(entries, key=lambda entry: entry["speedup_median"])
    xs = [entry["speedup_median"] for entry in entries]
    ys = [entry[quality] for entry in entries]
    bars = axes.errorbar(
        xs, ys, xerr=_bars(entries, "speedup", xs), yerr=_bars(entries, quality, ys), marker=marker,
        markersize=4, linewidth=1.2, elinewidth=0.7, capsize=2, label=wrap(family, 36),
    )  # fmt: skip
    line, caps, whiskers = bars.lines
    for artist in (*caps, *whiskers):
        artist.set_alpha(0.45)
    colour = line.get_color()
    for x, y, entry in zip(xs, ys, entries, strict=True) if len(entries) > 1 else ():  # a sweep: its settings
        label = entry["label"]
        setting = label[len(family) :].strip() if label.startswith(family) else label
        axes.annotate(setting, (x, y), textcoords="offset points", xytext=(4, 3), fontsize=6, color=colour)


def _bars(entries: list[dict], prefix: str, values: list[float]):
    """Asymmetric error bars from `<prefix>_lo` / `<prefix>_hi` (speedup_median's prefix is 'speedup');
    None unless every entry has both."""
    prefix = prefix.removesuffix("_median")
    lows = [entry.get(f"{prefix}_lo") for entry in entries]
    highs = [entry.get(f"{prefix}_hi") for entry in entries]
    if any(bound is None for bound in (*lows, *highs)):
        return None
    below = [max(value - low, 0.0) for value, low in zip(values, lows, strict=True)]
    above = [max(high - value, 0.0) for value, high in zip(values, highs, strict=True)]
    return [below, above]


def plot_speed_quality(summary: list[dict], path: Path, quality: str | None = None) -> Path:
    """speed_quality_figure written to `path`."""
    speed_quality_figure(summary, quality).savefig(path, dpi=120)
    return path


def grid_figure(images: list[list[torch.Tensor]], row_labels: list[str], col_labels: list[str]):
    """An image grid: images[row][col] [3, H, W] in [-1, 1], rows and columns labelled (wrapped between
    words); -> a matplotlib Figure."""
    from matplotlib.figure import Figure

    rows, cols = len(images), len(images[0])
    figure = Figure(figsize=(1.6 * cols + 1.4, 1.6 * rows + 0.8))
    axes = figure.subplots(rows, cols, squeeze=False)
    for r in range(rows):
        for c in range(cols):
            ax = axes[r][c]
            ax.imshow(((images[r][c].float().cpu() + 1) / 2).clamp(0, 1).permute(1, 2, 0).numpy())
            ax.set_xticks([])
            ax.set_yticks([])
            if c == 0:
                ax.set_ylabel(wrap(row_labels[r], 18), fontsize=7)
            if r == 0:
                ax.set_title(wrap(col_labels[c], 24), fontsize=6)
    figure.tight_layout()
    return figure


def plot_grid(
    images: list[list[torch.Tensor]], row_labels: list[str], col_labels: list[str], path: Path
) -> Path:
    """grid_figure written to `path`."""
    grid_figure(images, row_labels, col_labels).savefig(path, dpi=100)
    return path
