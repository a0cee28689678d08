"""The FD ratio's fast Frechet distance and its bootstrap interval (mulo_sd/evaluation/fd_ratio.py)."""

import numpy as np
import pytest
import torch

from mulo_sd.evaluation.fd_ratio import fd_ratio_intervals, frechet_distance_gram
from mulo_sd.evaluation.paired import Bootstrap
from mulo_sd.testbed.sceneeval import frechet_distance


@pytest.mark.parametrize("sizes", [(64, 128), (300, 250), (5, 7)])
def test_gram_form_equals_the_covariance_form(sizes):
    rng = np.random.default_rng(sizes[0])
    a = rng.normal(size=(sizes[0], 48))
    b = rng.normal(size=(sizes[1], 48)) * 1.3 + 0.2
    assert frechet_distance_gram(a, b) == pytest.approx(frechet_distance(a, b), rel=1e-7)
    assert frechet_distance_gram(a, a) == pytest.approx(0.0, abs=1e-9)


def features(rng, prompts, seeds, shift=0.0):
    return {(p, s): torch.tensor(rng.normal(size=(1, 16)) + shift) for p in prompts for s in seeds}


def test_interval_is_the_percentile_bootstrap_of_the_ratio_with_prompts_drawn_whole():
    rng = np.random.default_rng(0)
    prompts, seeds = list(range(10, 40)), [0, 1]
    real = {p: rng.normal(size=16) for p in prompts}
    runs = {"AR": features(rng, prompts, seeds), "X": features(rng, prompts, seeds, shift=1.0)}
    settings = Bootstrap(fd_resamples=200, seed=5)
    bounds = fd_ratio_intervals(real, runs, "AR", settings)

    # the same draws by hand, through the covariance-form FD: a drawn prompt brings its real image, both seeds
    draws = np.random.default_rng(5)
    ratios = []
    for _ in range(200):
        picked = [prompts[i] for i in draws.integers(0, len(prompts), len(prompts))]
        scenes = np.array([real[p] for p in picked])

        def fd(label, picked=picked, scenes=scenes):
            return frechet_distance(scenes, torch.cat([runs[label][p, s] for p in picked for s in seeds]))

        ratios.append(fd("X") / fd("AR"))
    assert bounds["X"] == pytest.approx((np.percentile(ratios, 2.5), np.percentile(ratios, 97.5)), rel=1e-6)
    assert bounds["AR"] == (1.0, 1.0)
    assert bounds["X"][0] > 1.0  # a shifted run: FD clearly above AR's
    assert fd_ratio_intervals(real, runs, "AR", settings) == bounds  # fixed generator seed


def test_a_run_like_the_reference_gets_an_interval_around_one():
    rng = np.random.default_rng(1)
    prompts, seeds = list(range(48)), [0]
    real = {p: rng.normal(size=16) for p in prompts}
    runs = {"AR": features(rng, prompts, seeds), "same": features(rng, prompts, seeds)}
    low, high = fd_ratio_intervals(real, runs, "AR", Bootstrap(fd_resamples=300))["same"]
    assert low < 1.0 < high


def test_few_prompts_give_no_interval_and_a_missing_decode_is_named():
    rng = np.random.default_rng(2)
    real = {3: rng.normal(size=16)}
    runs = {"AR": features(rng, [3], [0]), "X": features(rng, [3], [0])}
    assert fd_ratio_intervals(real, runs, "AR") == {"AR": (None, None), "X": (None, None)}
    real[4] = rng.normal(size=16)
    runs = {"AR": features(rng, [3, 4], [0, 1]), "X": features(rng, [3, 4], [0])}
    with pytest.raises(ValueError, match=r"fd_ratio: 'X' has no decode of prompt 3 at seed 1"):
        fd_ratio_intervals(real, runs, "AR")


def test_bootstrap_refuses_zero_fd_resamples():
    with pytest.raises(ValueError, match=r"fd_resamples >= 1"):
        Bootstrap(fd_resamples=0)
