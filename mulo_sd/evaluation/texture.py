"""Two texture statistics read from pixels (docs/statistics.md section 6): how much fine detail an image's
luma holds (`texture`), and how much of it is a regular pattern (`pattern`). SceneEval's checks read objects
and FD reads SceneEval's pooled features, and neither sees a striped or checkered background drawn as flat
or mottled grey, which is what the fast MuLo-SD settings do on the testbed; these statistics do.

Per image (`texture`): the RMS contrast of the luma's detail finer than 32 px (frequencies above `CUTOFF` =
1/32 cycles per pixel), in percent of the luma range:

    Y = 0.299 R + 0.587 G + 0.114 B on [0, 1]                 (Rec. 601; images come in [-1, 1])
    x = w * (Y - sum(w Y) / sum(w)),  w = hann(H) hann(W)^T   (periodic Hann; x sums to 0: no DC power)
    P(fy, fx) = |FFT2(x)|^2,  f = sqrt(fy^2 + fx^2)            (cycles per pixel, numpy's fftfreq)
    texture = 100 * sqrt(sum P over f > CUTOFF / (H W sum w^2))   (0 for a flat image)

By Parseval, H W sum w^2 turns the summed power into the window-weighted mean square of the detail, so a
sine wave of luma amplitude A above the cutoff scores about 100 A / sqrt(2). The statistic keeps contrast on
purpose: an earlier version, the *share* of power above 1/16, did not change with contrast and rated the
faint mottled patches the fast settings draw at AR's level of striped backgrounds (docs/statistics.md
section 6). The cutoff sits below SynthScenes' stripe and check frequencies (periods of 8 to 32 px at 128 px).

`band_shares` gives the spectrum's shape: the share of power in any bands (the profile over `OCTAVES`). The
window keeps the image's borders from reading as steps (the FFT wraps the image around); of a wave with a
whole number of periods across the image it moves a third of the power to the two bins next to it (1/W
cycles per pixel away), none further.

`pattern` counts only the regular part of that detail: the RMS contrast carried by the image's
`PATTERN_BINS` = 32 strongest FFT bins above the cutoff (16 conjugate pairs of frequencies), in the same
percent,

    pattern = 100 * sqrt(sum of the 32 largest P over f > CUTOFF / (H W sum w^2))   (<= texture)

A stripe or check pattern puts its detail in a few frequencies (a stripe's fundamental and harmonics; a
checkerboard's four fundamental peaks, each spread over a few bins by the window), so it keeps most of its
`texture` (SynthScenes' clean backgrounds at 128 px, tests/evaluation/test_texture.py: stripes 0.99 of it,
checks 0.87), while mottled blocks of the same contrast spread theirs over hundreds of frequencies (random
8 px blocks keep 0.44 to 0.54): the fast settings' blotches read as texture by contrast but not as a
pattern, as the eye reads them.

Per run (the harness), for each statistic s of `SCORES` ("texture", "pattern"): `s` is the mean over its
images, `s_ratio` that mean over the reference run's (same split), `s_gap` that mean minus the mean over
the real images of the same prompts (negative: smoother than the real scenes), and `d_s` the paired
difference to the reference decode of the same prompt and seed, with its bootstrap interval
(mulo_sd/evaluation/paired.py), as `d_sceneeval`.
"""

from __future__ import annotations

import torch

CUTOFF = 1 / 32  # cycles per pixel: detail finer than 32 px
OCTAVES = (1 / 64, 1 / 32, 1 / 16, 1 / 8, 1 / 4)  # band edges of the multi-scale profile, cycles per pixel
LUMA = (0.299, 0.587, 0.114)  # Rec. 601
PATTERN_BINS = 32  # FFT bins of `pattern`: a checkerboard's 4 fundamental peaks, ~8 bins each with the window
SCORES = ("texture", "pattern")  # the per-image statistics of a decode row, each with its run columns


def _hann(height: int, width: int) -> torch.Tensor:
    return torch.outer(
        torch.hann_window(height, dtype=torch.float64), torch.hann_window(width, dtype=torch.float64)
    )


def _windowed_luma(images: torch.Tensor) -> torch.Tensor:
    """[B, H, W] float64: the luma on [0, 1] of images [B, 3, H, W] in [-1, 1], its Hann-weighted mean
    removed, Hann-windowed."""
    channels = images.detach().cpu().double()
    # per pixel, not an einsum: a batched einsum rounds differently from one image's (1 ulp on AVX-512), and
    # an image's texture must not depend on the batch it was scored in
    luma = sum(weight * channels[:, c] for c, weight in enumerate(LUMA))
    window = _hann(*luma.shape[-2:])
    mean = (luma * window).sum((-2, -1), keepdim=True) / window.sum()
    return window * (luma - mean) / 2  # [-1, 1] -> [0, 1] after the mean: a flat image stays exactly 0


def _band_power(x: torch.Tensor, edges: tuple[float, ...]) -> torch.Tensor:
    """[B, len(edges) + 1]: the power P of windowed lumas x [B, H, W] summed over the bands of `edges`."""
    power = torch.fft.fft2(x).abs() ** 2
    band = torch.bucketize(radial_frequency(*x.shape[-2:]), torch.tensor(edges, dtype=torch.float64))
    per_band = torch.zeros(len(x), len(edges) + 1, dtype=torch.float64)
    per_band.index_add_(1, band.flatten(), power.flatten(1))
    return per_band


def radial_frequency(height: int, width: int) -> torch.Tensor:
    """[H, W]: the frequency, cycles per pixel, of each bin of an H x W FFT2 (unshifted order)."""
    fy = torch.fft.fftfreq(height, dtype=torch.float64)[:, None]
    fx = torch.fft.fftfreq(width, dtype=torch.float64)[None, :]
    return torch.sqrt(fy**2 + fx**2)


def band_shares(images: torch.Tensor, edges: tuple[float, ...] = OCTAVES) -> torch.Tensor:
    """[B, len(edges) + 1] float64: per image, the share of the power P (module docstring) in each band
    [0, e1], (e1, e2], ..., (ek, inf) of the frequency f; rows sum to 1, or are all 0 for an image without
    power (a flat image)."""
    per_band = _band_power(_windowed_luma(images), edges)
    total = per_band.sum(1, keepdim=True)
    return torch.where(total > 0, per_band / total.clamp_min(torch.finfo(torch.float64).tiny), 0.0)


def _detail_mean_squares(images: torch.Tensor, cutoff: float) -> torch.Tensor:
    """[B, H W] float64: per image, each FFT bin's power above `cutoff` (0 at or below it) over H W sum w^2,
    so that a sum over bins is the window-weighted mean square of that detail (module docstring)."""
    x = _windowed_luma(images)
    height, width = x.shape[-2:]
    above = radial_frequency(height, width) > cutoff
    power = torch.where(above, torch.fft.fft2(x).abs() ** 2, 0.0)
    return power.flatten(1) / (height * width * (_hann(height, width) ** 2).sum())


def _rms_percent(mean_squares: torch.Tensor) -> torch.Tensor:
    return 100 * mean_squares.sum(1).sqrt()


def _strongest(mean_squares: torch.Tensor, bins: int) -> torch.Tensor:
    """The `bins` largest of each row (all of a row with fewer), sorted: a fixed summing order."""
    return mean_squares.topk(min(bins, mean_squares.shape[1]), dim=1).values


def texture(images: torch.Tensor, cutoff: float = CUTOFF) -> torch.Tensor:
    """[B] float64: each image's RMS luma contrast above `cutoff` cycles per pixel, in percent (module
    docstring); images [B, 3, H, W] in [-1, 1]."""
    return _rms_percent(_detail_mean_squares(images, cutoff))


def pattern(images: torch.Tensor, cutoff: float = CUTOFF, bins: int = PATTERN_BINS) -> torch.Tensor:
    """[B] float64: each image's RMS luma contrast in its `bins` strongest FFT bins above `cutoff`, in
    percent (module docstring): the regular part of `texture`; images [B, 3, H, W] in [-1, 1]. An image
    with no more than `bins` bins (under 6 x 6 px) keeps them all: its pattern is its texture."""
    return _rms_percent(_strongest(_detail_mean_squares(images, cutoff), bins))


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def image_scores(images: torch.Tensor) -> list[dict[str, float]]:
    """Per image of [B, 3, H, W]: {statistic: value} for every statistic of SCORES, both read from one FFT
    of the image (the same numbers as `texture` and `pattern`)."""
    mean_squares = _detail_mean_squares(images, CUTOFF)
    textures = _rms_percent(mean_squares).tolist()
    patterns = _rms_percent(_strongest(mean_squares, PATTERN_BINS)).tolist()
    return [dict(zip(SCORES, pair, strict=True)) for pair in zip(textures, patterns, strict=True)]


def mean_scores(images: torch.Tensor) -> dict[str, float]:
    """{statistic of SCORES: its mean over images [B, 3, H, W]}, summed in image order (`texture_summary`)."""
    return texture_summary(image_scores(images))


def with_texture(rows: list[dict], images: torch.Tensor) -> list[dict]:
    """Copies of the per-image rows with each image's `texture` and `pattern` added; images [B, 3, H, W],
    one per row."""
    return [row | scores for row, scores in zip(rows, image_scores(images), strict=True)]


def texture_summary(rows: list[dict]) -> dict:
    """`texture`, `pattern`: the means of the rows' per-image statistics."""
    return {name: _mean([row[name] for row in rows]) for name in SCORES}


def real_textures(prompts: list) -> dict[str, dict[str, float]]:
    """Split -> {statistic: the mean over the real images of its prompts} (testbed Prompts)."""
    splits = dict.fromkeys(p.split for p in prompts)
    return {
        split: mean_scores(torch.stack([p.image for p in prompts if p.split == split])) for split in splits
    }


def add_texture_columns(summary: list[dict], real: dict[str, dict[str, float]], reference: str) -> None:
    """For each statistic s of SCORES, every summary entry's `s_ratio` (its mean s over the `reference` run's,
    same split; None when the reference's is 0) and `s_gap` (its mean minus `real[split][s]`, the mean over
    the real images of the split's prompts)."""
    for name in SCORES:
        base = {entry["split"]: entry[name] for entry in summary if entry["label"] == reference}
        for entry in summary:
            split = entry["split"]
            entry[f"{name}_ratio"] = entry[name] / base[split] if base[split] > 0 else None
            entry[f"{name}_gap"] = entry[name] - real[split][name]
