"""The image sizes training accepts, checked from the image header before any pixel is decoded.

The loader scales an image's short side to the training size before cropping, so a 1x20,000 px PNG of a few
kB would become a 20,000 px wide bitmap (seconds and gigabytes for one sample). PIL reads only the header
on open, so an image over `max_pixels` or more elongated than `max_aspect_ratio` (long side : short side)
is rejected before it is loaded: the datamodule skips it (`data.max_pixels`, `data.max_aspect_ratio`) and
`mulo-data verify` lists it. The defaults let real datasets through (LAION images are far below 64 MP, and
rarely beyond 4:1).
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_MAX_PIXELS = 64_000_000
DEFAULT_MAX_ASPECT_RATIO = 4.0


@dataclass(frozen=True)
class ImageLimits:
    """The largest image accepted: `max_pixels` (width * height), and `max_aspect_ratio` (long side : short
    side)."""

    max_pixels: int = DEFAULT_MAX_PIXELS
    max_aspect_ratio: float = DEFAULT_MAX_ASPECT_RATIO

    def __post_init__(self):
        if self.max_pixels < 1 or self.max_aspect_ratio < 1:
            raise ValueError(
                f"max_pixels must be >= 1 and max_aspect_ratio >= 1, got {self.max_pixels}, "
                f"{self.max_aspect_ratio}"
            )

    def problem(self, size: tuple[int, int]) -> str | None:
        """Why an image of `size` (width, height) is refused, or None when it is within the limits."""
        width, height = size
        if min(width, height) < 1:
            return f"image of {width}x{height} px has no pixels"
        if width * height > self.max_pixels:
            return f"image of {width}x{height} px is over max_pixels={self.max_pixels}"
        if max(width, height) > self.max_aspect_ratio * min(width, height):
            return f"image of {width}x{height} px is beyond max_aspect_ratio={self.max_aspect_ratio:g}"
        return None
