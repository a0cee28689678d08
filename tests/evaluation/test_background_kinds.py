"""Pattern and texture per background kind: the summary's per-kind means, paired differences, intervals and
table."""

import numpy as np
import pytest
from scipy.stats import bootstrap

from mulo_sd.evaluation.paired import Bootstrap
from mulo_sd.evaluation.summaries import add_ratios, summarize
from mulo_sd.evaluation.tables import background_kind_table

KINDS = ["striped", "gradient", "striped", "gradient", "striped", "gradient", "striped", "gradient"]


def rows(label, patterns, backgrounds, seed=0):
    return [
        {"family": label, "label": label, "method": "x", "knobs": "{}", "prompt_index": i, "seed": seed,
         "wall_s": 1.0, "sequential_steps": 10, "target_forwards": 10, "drafter_forwards": 0,
         "tokens_drafted": 0, "tokens_accepted": 0, "texture": 2 * value, "pattern": value,
         "background": kind, "sceneeval_background": float(value > 3)}
        for i, (value, kind) in enumerate(zip(patterns, backgrounds, strict=True))
    ]  # fmt: skip


def test_a_run_that_loses_stripes_and_blotches_gradients_shows_both_per_kind():
    rng = np.random.default_rng(0)
    ar = np.where(np.array(KINDS) == "striped", 6.0, 2.0) + rng.normal(0, 0.1, 8)
    # stripes lose 2, gradients gain 2: the mean over all images hides both
    x = ar + np.where(np.array(KINDS) == "striped", -2.0, 2.0) + rng.normal(0, 0.1, 8)
    data = rows("AR", ar, KINDS) + rows("X", x, KINDS)
    add_ratios(data, "AR")
    settings = Bootstrap(resamples=999, seed=2)
    base, entry = summarize(data, "AR", settings)
    assert abs(entry["d_pattern"]) < 0.2
    for kind, sign in (("striped", -1), ("gradient", 1)):
        mine = np.array([k == kind for k in KINDS])
        d = x[mine] - ar[mine]
        assert entry[f"d_pattern_{kind}"] == pytest.approx(d.mean())
        assert entry[f"pattern_{kind}"] == pytest.approx(x[mine].mean())
        assert entry[f"texture_{kind}"] == pytest.approx(2 * x[mine].mean())
        assert entry[f"d_texture_{kind}"] == pytest.approx(2 * d.mean())
        assert entry[f"background_{kind}"] == pytest.approx(np.mean(x[mine] > 3))
        direct = bootstrap((d,), np.mean, n_resamples=999, method="percentile", rng=np.random.default_rng(2))
        assert (entry[f"d_pattern_{kind}_lo"], entry[f"d_pattern_{kind}_hi"]) == pytest.approx(
            (direct.confidence_interval.low, direct.confidence_interval.high), abs=1e-12
        )
        assert sign * entry[f"d_pattern_{kind}_lo"] > 1.5 and sign * entry[f"d_pattern_{kind}_hi"] > 1.5
        assert sign * entry[f"d_texture_{kind}_lo"] > 3.0 and sign * entry[f"d_texture_{kind}_hi"] > 3.0
        assert base[f"d_pattern_{kind}"] == 0.0
    assert "d_pattern_checkered" not in entry  # no caption names it
    table = background_kind_table([base, entry])
    shown = f"{entry['d_pattern_striped']:.4g} [{entry['d_pattern_striped_lo']:.4g}, "
    assert shown in table and "| d_pattern_gradient |" in table and "checkered" not in table
    assert f"{entry['d_texture_gradient']:.4g} [{entry['d_texture_gradient_lo']:.4g}, " in table


def test_rows_without_a_background_kind_get_no_kind_columns():
    data = rows("AR", [1.0, 2.0], [None, None]) + rows("X", [1.5, 2.5], [None, None])
    add_ratios(data, "AR")
    assert not [column for column in summarize(data, "AR", Bootstrap(resamples=99))[1] if "striped" in column]
