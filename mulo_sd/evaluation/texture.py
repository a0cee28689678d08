"""A texture statistic read from pixels (docs/statistics.md section 6): how much fine detail an image's luma
holds. SceneEval's checks read objects and FD reads SceneEval's pooled features, and neither sees a striped
or checkered background drawn as flat or mottled grey, which is what the fast MuLo-SD settings do on the
testbed; this statistic does.

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

Per run (the harness): `texture` is the mean over its images, `texture_ratio` that mean over the
reference run's (same split), `texture_gap` that mean minus the mean over the real images of the same
prompts (negative: smoother than the real scenes), and `d_texture` the paired difference to the reference
decode of the same prompt and seed, with its bootstrap interval (mulo_sd/evaluation/paired.py), as
`d_sceneeval`.
"""

from __future__ import annotations

import torch

CUTOFF = 1 / 32  # cycles per pixel: detail finer than 32 px
OCTAVES = (1 / 64, 1 / 32, 1 / 16, 1 / 8, 1 / 4)  # band edges of the multi-scale profile, cycles per pixel
LUMA = (0.299, 0.587, 0.114)  # Rec. 601


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


def texture(images: torch.Tensor, cutoff: float = CUTOFF) -> torch.Tensor:
    """[B] float64: each image's RMS luma contrast above `cutoff` cycles per pixel, in percent (module
    docstring); images [B, 3, H, W] in [-1, 1]."""
    x = _windowed_luma(images)
    height, width = x.shape[-2:]
    mean_square = _band_power(x, (cutoff,))[:, 1] / (height * width * (_hann(height, width) ** 2).sum())
    return 100 * mean_square.sqrt()


def mean_texture(images: torch.Tensor) -> float:
    """The mean `texture` of images [B, 3, H, W] (summed in image order, as `texture_summary`)."""
    return _mean(texture(images).tolist())


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def with_texture(rows: list[dict], images: torch.Tensor) -> list[dict]:
    """Copies of the per-image rows with each image's `texture` added; images [B, 3, H, W], one per row."""
    return [row | {"texture": value} for row, value in zip(rows, texture(images).tolist(), strict=True)]


def texture_summary(rows: list[dict]) -> dict:
    """`texture`: the mean of the rows' per-image `texture`."""
    return {"texture": _mean([row["texture"] for row in rows])}


def real_textures(prompts: list) -> dict[str, float]:
    """Split -> the mean `texture` of the real images of its prompts (testbed Prompts)."""
    splits = dict.fromkeys(p.split for p in prompts)
    return {
        split: mean_texture(torch.stack([p.image for p in prompts if p.split == split])) for split in splits
    }


def add_texture_columns(summary: list[dict], real: dict[str, float], reference: str) -> None:
    """Every summary entry's `texture_ratio` (its mean `texture` over the `reference` run's, same split;
    None when the reference's is 0) and `texture_gap` (its mean minus `real[split]`, the mean over the real
    images of the split's prompts)."""
    base = {entry["split"]: entry["texture"] for entry in summary if entry["label"] == reference}
    for entry in summary:
        entry["texture_ratio"] = entry["texture"] / base[entry["split"]] if base[entry["split"]] > 0 else None
        entry["texture_gap"] = entry["texture"] - real[entry["split"]]
