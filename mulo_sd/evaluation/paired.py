"""Bootstrap intervals of per-decode statistics paired with the reference run (docs/evaluation.md section 5):
the mean of a paired difference (d_sceneeval, d_nll) and the median of a per-decode ratio (speedup).

The resampling unit is the prompt: the decodes of one prompt under the evaluation's seeds are drawn
together (scipy's `paired=True` over one sample per seed), so the interval does not treat two images of one
prompt as independent evidence. The statistic over the full data is the reported point (the mean, or median,
over every decode). Percentile intervals: SceneEval's per-image scores take a few discrete values and
medians of ratios have ties, where BCa's jackknife acceleration degenerates (NaN bounds).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.stats import bootstrap

METHOD = "percentile"


@dataclass(frozen=True)
class Bootstrap:
    """`resamples` bootstrap draws at `confidence`, from a generator seeded with `seed` (fixed: a rerun on the
    same numbers gives the same interval); `fd_resamples` draws for the FD ratio
    (mulo_sd/evaluation/fd_ratio.py),
    fewer because each draw refits FD for every run."""

    resamples: int = 9999
    confidence: float = 0.95
    seed: int = 0
    fd_resamples: int = 1999

    def __post_init__(self):
        if min(self.resamples, self.fd_resamples) < 1 or not 0 < self.confidence < 1:
            raise ValueError(
                f"bootstrap needs resamples >= 1, fd_resamples >= 1 and 0 < confidence < 1, got "
                f"{self.resamples}, {self.fd_resamples} and {self.confidence}"
            )


BOOTSTRAP = Bootstrap()


def per_seed_samples(rows: list[dict], column: str) -> tuple[np.ndarray, ...]:
    """One array per seed of `column`, the prompts (split, prompt_index) in the same order in each: the
    samples `interval` resamples together. Raises when a prompt lacks a seed another prompt has."""
    seeds = list(dict.fromkeys(row["seed"] for row in rows))
    prompts = list(dict.fromkeys((row.get("split"), row["prompt_index"]) for row in rows))
    values = {(row.get("split"), row["prompt_index"], row["seed"]): row[column] for row in rows}
    missing = [(p, s) for p in prompts for s in seeds if (*p, s) not in values]
    if missing:
        raise ValueError(f"'{column}': no decode for (split, prompt) {missing[0][0]} at seed {missing[0][1]}")
    return tuple(np.array([values[(*p, seed)] for p in prompts], dtype=np.float64) for seed in seeds)


def _pooled(statistic):
    def pooled(*samples, axis=-1):
        return statistic(np.concatenate(samples, axis=axis), axis=axis)

    return pooled


def interval(
    samples: tuple[np.ndarray, ...], statistic=np.mean, settings: Bootstrap = BOOTSTRAP
) -> tuple[float | None, float | None]:
    """The bootstrap interval (low, high) of `statistic` (np.mean or np.median, with an `axis` argument) over
    all samples pooled, the prompts resampled (module docstring); (None, None) with fewer than 2 prompts."""
    if len(samples[0]) < 2:
        return None, None
    result = bootstrap(
        samples, _pooled(statistic), n_resamples=settings.resamples, paired=True, vectorized=True,
        confidence_level=settings.confidence, method=METHOD, rng=np.random.default_rng(settings.seed),
    )  # fmt: skip
    return float(result.confidence_interval.low), float(result.confidence_interval.high)
