"""FD relative to the reference run, with a bootstrap interval (docs/evaluation.md section 5).

`fd_ratio` is a run's FD to the real images over the reference run's FD to the same images. Its interval
resamples the prompts as mulo_sd/evaluation/paired.py does: a drawn prompt brings its real image and its
decodes under
every seed, for the run and the reference alike, so the ratio's spread is the prompt-to-prompt spread and
not the (shared) small-sample bias of FD. The goals are stated as FD ratios ("FD <= 1.2x AR's"), and at a
hundred images two seeds of AR already differ by several percent, so a ratio near its bar needs an interval.

FD is a statistic of a whole image set, not a mean of per-image values, so every draw refits it; the draws
use the Gram form below (one SVD of [Na, Nb]) rather than two eigendecompositions of [F, F] covariances.
"""

from __future__ import annotations

import numpy as np

from mulo_sd.evaluation.paired import BOOTSTRAP, Bootstrap


def frechet_distance_gram(features_a: np.ndarray, features_b: np.ndarray) -> float:
    """`sceneeval.frechet_distance` of two float64 feature sets [Na, F], [Nb, F], through the samples: with
    centred A, B the covariances are A^T A / (Na-1) and B^T B / (Nb-1), and the nonzero eigenvalues of
    their product are the squared singular values of A B^T / sqrt((Na-1)(Nb-1)), so tr (cov_a cov_b)^(1/2)
    is the sum of those singular values."""
    centred_a, centred_b = features_a - features_a.mean(0), features_b - features_b.mean(0)
    scale_a, scale_b = len(features_a) - 1, len(features_b) - 1
    trace_sqrt = np.linalg.svd(centred_a @ centred_b.T, compute_uv=False).sum() / np.sqrt(scale_a * scale_b)
    mean_term = np.sum((features_a.mean(0) - features_b.mean(0)) ** 2)
    traces = np.sum(centred_a**2) / scale_a + np.sum(centred_b**2) / scale_b
    return max(float(mean_term + traces - 2.0 * trace_sqrt), 0.0)


def _vector(features) -> np.ndarray:
    """One image's features (a CPU tensor or array, [F] or [1, F]) as float64 [F]."""
    return np.asarray(features, dtype=np.float64).reshape(-1)


def _by_prompt(decodes: dict, prompts: list, seeds: list, label: str) -> np.ndarray:
    """[prompts, seeds, F] from {(prompt, seed): features [1, F]}; raises naming the first missing decode."""
    missing = [(p, s) for p in prompts for s in seeds if (p, s) not in decodes]
    if missing:
        prompt, seed = missing[0]
        raise ValueError(f"fd_ratio: '{label}' has no decode of prompt {prompt} at seed {seed}")
    return np.array([[_vector(decodes[p, s]) for s in seeds] for p in prompts])


def fd_ratio_intervals(
    real: dict, runs: dict[str, dict], reference: str, settings: Bootstrap = BOOTSTRAP
) -> dict[str, tuple[float | None, float | None]]:
    """Per run label: the `settings.confidence` percentile bootstrap interval (low, high), from
    `settings.fd_resamples` draws, of its FD to the real images over `reference`'s. real: prompt ->
    features [F] of its real image; runs: label -> {(prompt, seed): features [1, F]} (the reference among
    them), every run with every (prompt, seed) of the reference. (None, None) for every run with fewer
    than 2 prompts."""
    prompts = list(real)
    seeds = sorted({seed for _, seed in runs[reference]})
    if len(prompts) < 2:
        return dict.fromkeys(runs, (None, None))
    real_array = np.array([_vector(real[p]) for p in prompts])
    decoded = {label: _by_prompt(decodes, prompts, seeds, label) for label, decodes in runs.items()}
    rng = np.random.default_rng(settings.seed)
    ratios = {label: np.empty(settings.fd_resamples) for label in runs}
    for n in range(settings.fd_resamples):
        draw = rng.integers(0, len(prompts), len(prompts))
        scenes = real_array[draw]
        fds = {
            label: frechet_distance_gram(scenes, array[draw].reshape(-1, scenes.shape[1]))
            for label, array in decoded.items()
        }
        for label, fd in fds.items():
            ratios[label][n] = fd / fds[reference]
    tail = 50.0 * (1.0 - settings.confidence)
    return {
        label: (float(np.percentile(values, tail)), float(np.percentile(values, 100.0 - tail)))
        for label, values in ratios.items()
    }
