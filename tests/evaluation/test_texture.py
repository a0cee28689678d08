"""The texture statistics (mulo_sd/evaluation/texture.py: `texture`, `pattern`) on constructed images, and
their noise report's comparisons (mulo_sd/evaluation/texture_noise.py)."""

import math

import numpy as np
import pytest
import torch
from scipy.stats import bootstrap, ttest_rel

from mulo_sd.evaluation.paired import Bootstrap
from mulo_sd.evaluation.texture import (
    CUTOFF,
    OCTAVES,
    PATTERN_BINS,
    add_texture_columns,
    band_shares,
    mean_scores,
    pattern,
    radial_frequency,
    texture,
)
from mulo_sd.evaluation.texture_noise import compare, comparisons, seed_effect
from mulo_sd.testbed.synthscenes import render

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
    assert mean_scores(images)["texture"] == sum(together.tolist()) / 3
    assert mean_scores(images)["pattern"] == sum(pattern(images).tolist()) / 3
    # colour enters through the luma only: a grey image of the hand-computed luma scores the same
    luma = 0.299 * images[:, 0] + 0.587 * images[:, 1] + 0.114 * images[:, 2]
    assert texture(luma[:, None].expand(-1, 3, -1, -1)) == pytest.approx(together, rel=1e-6)
    frequencies = radial_frequency(4, 4)  # fftfreq order: 0, 1/4, -1/2, -1/4
    assert frequencies[0, 2].item() == 0.5 and frequencies[1, 3].item() == pytest.approx(
        math.hypot(0.25, 0.25)
    )


def background(kind: str, **parameters) -> torch.Tensor:
    """[1, 3, 128, 128] in [-1, 1]: a SynthScenes background without objects."""
    attributes = {"background": {"kind": kind, "colours": [[70, 80, 60], [190, 180, 200]], **parameters}}
    pixels = np.asarray(render(attributes | {"objects": []}, SIZE), dtype=np.float32)
    return torch.from_numpy(pixels).permute(2, 0, 1)[None] / 127.5 - 1


def blocks(size: int, seed: int) -> torch.Tensor:
    """A grey image of random dark and light square blocks of `size` px: mottling, no pattern."""
    cells = torch.randint(0, 2, (SIZE // size, SIZE // size), generator=torch.Generator().manual_seed(seed))
    return grey(cells.repeat_interleave(size, 0).repeat_interleave(size, 1) * 0.6 - 0.3)


def test_pattern_keeps_a_regular_patterns_contrast_and_drops_most_of_mottlings():
    flat = torch.full((1, 3, SIZE, SIZE), 0.37)
    assert pattern(flat).item() == pytest.approx(0.0, abs=1e-12)  # float rounding of the mean only
    wave = 0.5 * sinusoid(5, 12)  # one frequency: the window spreads it over 3 x 3 bins of each sign
    assert pattern(wave).item() == pytest.approx(texture(wave).item(), rel=1e-9)
    kept = {}
    for angle in (0.0, 23.5, 61.0):  # SynthScenes' own stripes and checks, at angles off the FFT grid
        stripes, checks = (
            background("striped", angle=angle, period=0.1),
            background("checkered", angle=angle, cell=0.08),
        )
        kept[angle] = (pattern(stripes) / texture(stripes)).item(), (pattern(checks) / texture(checks)).item()
    assert all(s > 0.93 and c > 0.75 for s, c in kept.values()), kept
    mottled = torch.cat([blocks(8, seed) for seed in range(8)])
    assert (pattern(mottled) / texture(mottled)).max().item() < 0.6  # the same contrast, no pattern
    # contrast-linear and batch-independent as texture; every bin above the cutoff: texture itself
    assert pattern(0.5 * mottled + 0.2) == pytest.approx(0.5 * pattern(mottled), rel=1e-6)
    assert torch.equal(pattern(mottled), torch.cat([pattern(image[None]) for image in mottled]))
    above = int((radial_frequency(SIZE, SIZE) > CUTOFF).sum())
    assert pattern(mottled, bins=above) == pytest.approx(texture(mottled), rel=1e-12)
    assert PATTERN_BINS == 32 and (pattern(mottled) <= texture(mottled)).all()
    tiny = mottled[:, :, :5, :5]  # 25 bins, fewer than PATTERN_BINS: all of them
    assert pattern(tiny) == pytest.approx(texture(tiny), rel=1e-12)


def test_run_columns_are_the_ratio_to_the_reference_and_the_gap_to_the_real_images():
    summary = [
        {"split": "test", "label": "AR", "texture": 0.2, "pattern": 0.1},
        {"split": "test", "label": "X", "texture": 0.1, "pattern": 0.02},
        {"split": "dev", "label": "AR", "texture": 0.0, "pattern": 0.0},
        {"split": "dev", "label": "X", "texture": 0.05, "pattern": 0.01},
    ]
    real = {"test": {"texture": 0.3, "pattern": 0.25}, "dev": {"texture": 0.25, "pattern": 0.2}}
    add_texture_columns(summary, real, "AR")
    assert [entry["texture_ratio"] for entry in summary] == [1.0, 0.1 / 0.2, None, None]
    assert [entry["texture_gap"] for entry in summary] == [0.2 - 0.3, 0.1 - 0.3, 0.0 - 0.25, 0.05 - 0.25]
    assert [entry["pattern_ratio"] for entry in summary] == [1.0, 0.02 / 0.1, None, None]
    assert [entry["pattern_gap"] for entry in summary] == [0.1 - 0.25, 0.02 - 0.25, 0.0 - 0.2, 0.01 - 0.2]


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
    named = compare(values, list(range(10)), (0, 1), (2, 3), settings, name="pattern")
    assert named == {key.replace("texture", "pattern"): value for key, value in two.items()}


def test_the_seed_effect_is_the_paired_t_test_at_two_seeds_and_found_when_a_seed_shifts_every_prompt():
    rng = np.random.default_rng(3)
    values = {(i, s): float(rng.uniform(0, 0.5)) for i in range(12) for s in range(3)}
    f, p = seed_effect(values, list(range(12)), [0, 1], Bootstrap(resamples=999))
    t = ttest_rel([values[i, 1] for i in range(12)], [values[i, 0] for i in range(12)])
    assert f == pytest.approx(t.statistic**2, rel=1e-10) and 0 < p <= 1
    shifted = {(i, s): value + 0.3 * (s == 2) for (i, s), value in values.items()}
    f3, p3 = seed_effect(shifted, list(range(12)), [0, 1, 2], Bootstrap(resamples=999))
    assert f3 > 10 and p3 == 1 / 1000  # no permutation within the prompts beats the observed table
