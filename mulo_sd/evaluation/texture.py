"""A texture statistic read from pixels (docs/statistics.md section 6): how much of an image's luma variation
is fine detail. SceneEval's checks read objects and FD reads SceneEval's pooled features, and neither sees a
striped or checkered background drawn as flat grey, which is what the fastest MuLo-SD settings do on the
testbed; this statistic does.

Per image (`texture`): the share of spectral power above `CUTOFF` = 1/16 cycles per pixel (radius 8 of a
128 px image's FFT, about 16 px per period), of

    luma Y = 0.299 R + 0.587 G + 0.114 B                      (Rec. 601, on the image's own value range)
    x = w * (Y - sum(w Y) / sum(w)),  w = hann(H) hann(W)^T   (periodic Hann; x sums to 0: no DC power)
    P(fy, fx) = |FFT2(x)|^2,  f = sqrt(fy^2 + fx^2)            (cycles per pixel, numpy's fftfreq)
    texture = sum P over f > CUTOFF / sum P                    (0 for an image with no power: a flat one)

`band_shares` gives the same shares over any bands (the profile over `OCTAVES`). The window keeps the
image's borders from reading as steps (the FFT wraps the image around); of a wave with a whole number
of periods across the image it moves a third of the power to the two bins next to it (1/W cycles per pixel
away), none further. The share does not depend on brightness or contrast (an affine change of the pixel
values), only on the spectrum's shape.

Per run (the harness): `texture` is the mean over its images, `texture_ratio` that mean over the
reference run's (same split), `texture_gap` that mean minus the mean over the real images of the same
prompts (negative: smoother than the real scenes), and `d_texture` the paired difference to the reference
decode of the same prompt and seed, with its bootstrap interval (mulo_sd/evaluation/paired.py), as
`d_sceneeval`.
"""

from __future__ import annotations

import torch

CUTOFF = 1 / 16  # cycles per pixel
OCTAVES = (1 / 64, 1 / 32, 1 / 16, 1 / 8, 1 / 4)  # band edges of the multi-scale profile, cycles per pixel
LUMA = (0.299, 0.587, 0.114)  # Rec. 601


def _windowed_luma(images: torch.Tensor) -> torch.Tensor:
    """[B, H, W] float64: the luma of images [B, 3, H, W], its Hann-weighted mean removed, Hann-windowed."""
    luma = torch.einsum(
        "bchw,c->bhw", images.detach().cpu().double(), torch.tensor(LUMA, dtype=torch.float64)
    )
    height, width = luma.shape[-2:]
    window = torch.outer(
        torch.hann_window(height, dtype=torch.float64), torch.hann_window(width, dtype=torch.float64)
    )
    mean = (luma * window).sum((-2, -1), keepdim=True) / window.sum()
    return window * (luma - mean)


def radial_frequency(height: int, width: int) -> torch.Tensor:
    """[H, W]: the frequency, cycles per pixel, of each bin of an H x W FFT2 (unshifted order)."""
    fy = torch.fft.fftfreq(height, dtype=torch.float64)[:, None]
    fx = torch.fft.fftfreq(width, dtype=torch.float64)[None, :]
    return torch.sqrt(fy**2 + fx**2)


def band_shares(images: torch.Tensor, edges: tuple[float, ...] = OCTAVES) -> torch.Tensor:
    """[B, len(edges) + 1] float64: per image, the share of the power P (module docstring) in each band
    [0, e1], (e1, e2], ..., (ek, inf) of the frequency f; rows sum to 1, or are all 0 for an image without
    power (a flat image)."""
    x = _windowed_luma(images)
    power = torch.fft.fft2(x).abs() ** 2
    band = torch.bucketize(radial_frequency(*x.shape[-2:]), torch.tensor(edges, dtype=torch.float64))
    per_band = torch.zeros(len(x), len(edges) + 1, dtype=torch.float64)
    per_band.index_add_(1, band.flatten(), power.flatten(1))
    total = per_band.sum(1, keepdim=True)
    return torch.where(total > 0, per_band / total.clamp_min(torch.finfo(torch.float64).tiny), 0.0)


def texture(images: torch.Tensor, cutoff: float = CUTOFF) -> torch.Tensor:
    """[B] float64: each image's share of power above `cutoff` cycles per pixel (module docstring)."""
    return band_shares(images, (cutoff,))[:, 1]


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
