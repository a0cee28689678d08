"""The evaluations' figures: speed_quality.png faceted to at most 8 series a panel, with the bootstrap
intervals as error bars and the legend outside the axes; grid labels wrapped between words only."""

from __future__ import annotations

import json
import textwrap

import pytest
import torch
from matplotlib.container import ErrorbarContainer

from mulo_sd.evaluation.plots import (
    BASELINES,
    MAX_SERIES,
    default_quality,
    grid_figure,
    plot_speed_quality,
    speed_quality_figure,
    speed_quality_panels,
)

# the families of conf/eval/paper_table_quick.yaml: 17, each over a short sweep
BASELINE_FAMILIES = {"AR": "ar", "ZipAR": "zipar", "LANTERN": "lantern"}
MULO_2X = ["", " typical", " typical, target_kl", " typical, bicubic-distilled", " typical, pixel",
           " typical, bicubic-distilled, not row-causal"]  # fmt: skip
MULO_4X = ["", " typical", " l=1", " l=1 typical, pixel", " typical, pixel", " typical, bicubic-distilled",
           " l=1 typical, bicubic-distilled", " l=1 typical, bicubic-distilled, not row-causal"]  # fmt: skip


def entry(family: str, method: str, knobs: dict, setting: str, speedup: float, quality: float) -> dict:
    return {
        "family": family, "label": f"{family} {setting}".strip(), "method": method,
        "knobs": json.dumps(knobs),
        "speedup_median": speedup, "speedup_lo": speedup * 0.9, "speedup_hi": speedup * 1.1,
        "sceneeval": 0.25 + quality, "d_sceneeval": quality, "d_sceneeval_lo": quality - 0.05,
        "d_sceneeval_hi": quality + 0.05,
    }  # fmt: skip


def paper_summary() -> list[dict]:
    summary = [entry("AR", "ar", {}, "", 1.0, 0.0)]
    for family, method in list(BASELINE_FAMILIES.items())[1:]:
        summary += [entry(family, method, {}, f"w={w}", 1 + w, 0.1 / w) for w in (1, 2, 4)]
    for r, variants in ((2, MULO_2X), (4, MULO_4X)):
        for i, variant in enumerate(variants):
            family = f"MuLo-SD ({r}x){variant}"
            summary += [
                entry(family, "mulo", {"r": r, "tau": tau}, f"tau={tau}", 5 + i * 0.01 + tau, -tau)  # dense
                for tau in (0.02, 0.05)
            ]
    return summary


def test_many_families_are_faceted_into_panels_of_at_most_eight():
    summary = paper_summary()
    panels = speed_quality_panels(summary)
    assert len({e["family"] for e in summary}) == 17
    assert list(panels) == [BASELINES, "MuLo-SD 2x", "MuLo-SD 4x"]
    assert all(len(families) <= MAX_SERIES for families in panels.values())
    drawn = [family for families in panels.values() for family in families]
    assert sorted(drawn) == sorted({e["family"] for e in summary})  # each family in one panel
    few = [e for e in summary if e["family"] in ("AR", "ZipAR", "MuLo-SD (2x)")]
    assert speed_quality_panels(few) == {"": ["AR", "ZipAR", "MuLo-SD (2x)"]}  # one panel while it fits
    wide = summary + [entry(f"MuLo-SD (4x) extra {i}", "mulo", {"r": 4}, "", 6.0, 0.0) for i in range(3)]
    cut = speed_quality_panels(wide)
    assert [len(cut[f"MuLo-SD 4x ({n}/2)"]) for n in (1, 2)] == [8, 3]
    unnamed = [entry(f"MuLo-SD set {i}", "mulo", {}, "", 6.0, 0.0) for i in range(9)]
    assert list(speed_quality_panels(unnamed)) == ["MuLo-SD (1/2)", "MuLo-SD (2/2)"]  # r unknown: no r


def test_every_point_has_both_intervals_as_error_bars_and_the_legends_sit_outside():
    summary = paper_summary()
    figure = speed_quality_figure(summary)
    assert default_quality(summary) == "d_sceneeval"
    figure.draw_without_rendering()
    renderer = figure.canvas.get_renderer()
    panels = speed_quality_panels(summary)
    assert len(figure.axes) == len(panels)
    for axes, families in zip(figure.axes, panels.values(), strict=True):
        bars = [c for c in axes.containers if isinstance(c, ErrorbarContainer)]
        assert len(bars) == len(families) <= MAX_SERIES
        assert all(c.has_xerr and c.has_yerr for c in bars)
        points = sum(len(c.lines[0].get_xdata()) for c in bars)
        assert sum(len(segments.get_segments()) for c in bars for segments in c.lines[2]) == 2 * points
        legend = axes.get_legend()
        assert [t.get_text().replace("\n", " ") for t in legend.get_texts()] == families
        inside, box = axes.get_window_extent(renderer), legend.get_window_extent(renderer)
        assert box.x0 >= inside.x1 and not box.overlaps(inside)
        labels = [text.get_window_extent(renderer) for text in axes.texts]
        assert not any(a.overlaps(b) for i, a in enumerate(labels) for b in labels[i + 1 :])


def test_only_the_intervals_the_summary_has_are_drawn(tmp_path):
    summary = [{k: v for k, v in e.items() if not k.startswith("d_sceneeval_")} for e in paper_summary()]
    figure = speed_quality_figure(summary)
    bars = [c for axes in figure.axes for c in axes.containers]
    assert bars and all(c.has_xerr and not c.has_yerr for c in bars)
    no_quality = [{k: v for k, v in e.items() if "sceneeval" not in k} for e in paper_summary()]
    assert default_quality(no_quality) == "step_ratio_median"
    path = plot_speed_quality(paper_summary(), tmp_path / "speed_quality.png")
    assert path.stat().st_size > 0


@pytest.mark.parametrize("width", [18, 24])
def test_grid_labels_wrap_between_words_only(width):
    label = "MuLo-SD (4x) l=1 typical, bicubic-distilled, not row-causal tau=0.05"
    caption = "#12: two red circles left of a blue star on a striped background"
    figure = grid_figure([[torch.zeros(3, 4, 4)] * 2], [label], [caption, caption])
    shown = figure.axes[0].get_ylabel(), figure.axes[0].get_title()
    for text, original in zip(shown, (label, caption), strict=True):
        assert text.split() == original.split()  # every word whole, in order
        assert len(text.splitlines()) > 1
    assert "bicubic-distilled," in shown[0].split("\n")[2]
    assert textwrap.fill(label, 18) != shown[0]  # textwrap's default would split 'bicubic-distilled,'
