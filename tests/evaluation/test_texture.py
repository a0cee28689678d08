"""The texture statistic (mulo_sd/evaluation/texture.py) on constructed images, and its noise report's
comparisons (mulo_sd/evaluation/texture_noise.py)."""

import math

import numpy as np
import pytest
import torch
from scipy.stats import bootstrap, ttest_rel

from mulo_sd.evaluation.paired import Bootstrap
from mulo_sd.evaluation.texture import (
    CUTOFF,
    OCTAVES,
    add_texture_columns,
    band_shares,
    mean_texture,
    radial_frequency,
    texture,
)
from mulo_sd.evaluation.texture_noise import compare, comparisons, seed_effect

SIZE = 128


def grey(luma: torch.Tensor) -> torch.Tensor:
    """[1, 3, H, W]: a grey image of luma [H, W] (luma weights sum to 1)."""
    return luma.expand(3, -1, -1)[None].float()


def sinusoid(cycles_y: int, cycles_x: int, size: int = SIZE) -> torch.Tensor:
    """A grey image of a plane wave with the given whole numbers of periods across the image."""
    y, x = torch.meshgrid(torch.arange(size), torch.arange(size), indexing="ij")
    return grey(0.8 * torch.cos(2 * math.pi * (cycles_y * y + cycles_x * x) / size))


def test_a_flat_image_scores_zero_and_a_fine_wave_scores_its_rms_contrast():
    flat = torch.cat([torch.zeros(1, 3, SIZE, SIZE), torch.full((1, 3, SIZE, SIZE), 0.37)])
    assert texture(flat).tolist() == pytest.approx([0.0, 0.0], abs=1e-12)
    assert band_shares(flat[:1]).sum() == 0  # no power at all: every share 0
    # luma 0.5 +- 0.2 on [0, 1] is 0 +- 0.4 in the [-1, 1] images: RMS 0.2 / sqrt(2) of the luma range
    for cycles in (6, 16, 40):  # periods of 21, 8 and 3.2 px, all finer than 32 px
        assert texture(0.5 * sinusoid(0, cycles)).item() == pytest.approx(100 * 0.2 / math.sqrt(2), rel=1e-6)
    columns = torch.arange(SIZE) % 4 < 2  # stripes of 2 px: a square wave of luma amplitude 0.45
    stripes = grey(torch.where(columns, 0.9, -0.9).expand(SIZE, -1))
    # a square wave's RMS is its amplitude, and all of its harmonics lie above the cutoff
    assert texture(stripes).item() == pytest.approx(100 * 0.9 / 2, rel=1e-6)
    smooth = grey(torch.linspace(-1, 1, SIZE).expand(SIZE, -1))  # a gradient background
    assert texture(smooth).item() < 0.05 * texture(stripes).item()
    # the same pattern at half the contrast scores half: faint mottling is not a full texture
    assert texture(0.5 * stripes).item() == pytest.approx(texture(stripes).item() / 2, rel=1e-9)


@pytest.mark.parametrize(
    ("cycles_y", "cycles_x", "band"), [(0, 6, 2), (10, 10, 3), (0, 20, 4), (40, 30, 5), (37, 0, 5)]
)
def test_a_sinusoid_lands_in_the_band_of_its_frequency(cycles_y, cycles_x, band):
    frequency = math.hypot(cycles_y, cycles_x) / SIZE
    edges = (0.0, *OCTAVES, math.inf)
    assert edges[band] < frequency <= edges[band + 1]
    shares = band_shares(sinusoid(cycles_y, cycles_x))[0]
    assert shares.sum().item() == pytest.approx(1.0, abs=1e-12)
    assert shares[band].item() > 0.99
    full = 100 * 0.4 / math.sqrt(2)  # the wave's luma amplitude on [0, 1] is 0.4
    above = texture(sinusoid(cycles_y, cycles_x)).item() / full
    assert above == pytest.approx(float(frequency > CUTOFF), abs=0.01)


def test_the_window_spreads_a_frequency_over_its_neighbouring_bins_only():
    # the octaves below 1/32 are 2 bins wide at 128 px, so a low wave is placed between custom edges: the
    # Hann window moves 1/3 of its power to the bins next to it (frequencies k-1 and k+1), none further
    wave = sinusoid(0, 3)
    assert band_shares(wave, (1.5 / SIZE, 4.5 / SIZE))[0, 1].item() == pytest.approx(1.0, abs=1e-12)
    assert band_shares(wave, (2.5 / SIZE, 3.5 / SIZE))[0].tolist() == pytest.approx([1 / 6, 2 / 3, 1 / 6])


def test_the_statistic_ignores_brightness_and_batching_scales_with_contrast_and_reads_the_luma():
    rng = torch.Generator().manual_seed(0)
    images = torch.rand(3, 3, 32, 48, generator=rng) * 2 - 1
    together = texture(images)
    assert torch.equal(together, torch.cat([texture(image[None]) for image in images]))
    assert texture(0.5 * images + 0.2) == pytest.approx(0.5 * together, rel=1e-6)  # float32 inputs
    assert mean_texture(images) == sum(together.tolist()) / 3
    # colour enters through the luma only: a grey image of the hand-computed luma scores the same
    luma = 0.299 * images[:, 0] + 0.587 * images[:, 1] + 0.114 * images[:, 2]
    assert texture(luma[:, None].expand(-1, 3, -1, -1)) == pytest.approx(together, rel=1e-6)
    frequencies = radial_frequency(4, 4)  # fftfreq order: 0, 1/4, -1/2, -1/4
    assert frequencies[0, 2].item() == 0.5 and frequencies[1, 3].item() == pytest.approx(
        math.hypot(0.25, 0.25)
    )


def test_run_columns_are_the_ratio_to_the_reference_and_the_gap_to_the_real_images():
    summary = [
        {"split": "test", "label": "AR", "texture": 0.2},
        {"split": "test", "label": "X", "texture": 0.1},
        {"split": "dev", "label": "AR", "texture": 0.0},
        {"split": "dev", "label": "X", "texture": 0.05},
    ]
    add_texture_columns(summary, {"test": 0.3, "dev": 0.25}, "AR")
    assert [entry["texture_ratio"] for entry in summary] == [1.0, 0.1 / 0.2, None, None]
    assert [entry["texture_gap"] for entry in summary] == [0.2 - 0.3, 0.1 - 0.3, 0.0 - 0.25, 0.05 - 0.25]


def test_noise_comparisons_pair_disjoint_seed_sets_and_equal_scipy_on_the_differences():
    assert comparisons([0, 1, 2]) == [((0,), (1,)), ((0,), (2,)), ((1,), (2,))]
    four = comparisons([0, 1, 2, 3])
    assert four[6:] == [((0, 1), (2, 3)), ((0, 2), (1, 3)), ((0, 3), (1, 2))] and len(four) == 9
    rng = np.random.default_rng(5)
    values = {(i, s): float(rng.uniform(0, 0.5)) for i in range(10) for s in range(4)}
    settings = Bootstrap(resamples=999, seed=2)
    row = compare(values, list(range(10)), (0,), (3,), settings)
    d = np.array([values[i, 3] - values[i, 0] for i in range(10)])
    direct = bootstrap((d,), np.mean, n_resamples=999, method="percentile", rng=np.random.default_rng(2))
    assert row["d_texture"] == float(d.mean())
    assert (row["d_texture_lo"], row["d_texture_hi"]) == (
        direct.confidence_interval.low,
        direct.confidence_interval.high,
    )
    means = [np.mean([values[i, s] for i in range(10)]) for s in (0, 3)]
    assert row["texture_ratio"] == float(means[1] / means[0])
    assert row["excludes 0"] == ("no" if row["d_texture_lo"] <= 0 <= row["d_texture_hi"] else "yes")
    two = compare(values, list(range(10)), (0, 1), (2, 3), settings)
    pooled = [values[i, b] - values[i, a] for a, b in ((0, 2), (1, 3)) for i in range(10)]
    assert two["d_texture"] == pytest.approx(float(np.mean(pooled)), abs=1e-15)


def test_the_seed_effect_is_the_paired_t_test_at_two_seeds_and_found_when_a_seed_shifts_every_prompt():
    rng = np.random.default_rng(3)
    values = {(i, s): float(rng.uniform(0, 0.5)) for i in range(12) for s in range(3)}
    f, p = seed_effect(values, list(range(12)), [0, 1], Bootstrap(resamples=999))
    t = ttest_rel([values[i, 1] for i in range(12)], [values[i, 0] for i in range(12)])
    assert f == pytest.approx(t.statistic**2, rel=1e-10) and 0 < p <= 1
    shifted = {(i, s): value + 0.3 * (s == 2) for (i, s), value in values.items()}
    f3, p3 = seed_effect(shifted, list(range(12)), [0, 1, 2], Bootstrap(resamples=999))
    assert f3 > 10 and p3 == 1 / 1000  # no permutation within the prompts beats the observed table
