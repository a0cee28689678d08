"""Timing of the cost model's calls (mulo_sd/evaluation/cost_model.py): random-weight models of a real
set's shapes, built one at a time, each kind of call timed at the token counts asked for."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable

import torch

from mulo_sd.nets.downsampler import Downsampler, DownsamplerConfig
from mulo_sd.nets.eagle_head import EagleHead, EagleHeadConfig
from mulo_sd.nets.gpt import GPT
from mulo_sd.nets.gpt_config import GPTConfig
from mulo_sd.nets.upsampler import Upsampler, UpsamplerConfig


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_call(fn: Callable[[], object], device: torch.device, repeats: int, slow_s: float) -> float:
    """Seconds of one call of `fn`: a warm-up call, then the median of `repeats` calls; a warm-up slower
    than `slow_s` is taken as the measurement."""
    times = []
    for i in range(1 + repeats):
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - start)
        if i == 0 and times[0] >= slow_s:
            return times[0]
    return statistics.median(times[1:])


def bucket_points(tokens: list[int], base: int = 2) -> list[int]:
    """The n at which to time a call fed any of `tokens`: powers of `base` from the largest one <= the
    smallest n up to below the largest n, and the largest n itself."""
    low, high = min(tokens), max(tokens)
    if low < 1:
        raise ValueError(f"token counts must be >= 1, got {low}")
    point = base ** int(math.floor(math.log(low, base) + 1e-9))
    points = []
    while point < high:
        points.append(point)
        point *= base
    return [*points, high]


def interpolate(points: dict[int, float], n: int) -> float:
    """Linear interpolation of timings {n: seconds} at n (clamped to the timed range)."""
    xs = sorted(points)
    if n <= xs[0]:
        return points[xs[0]]
    if n >= xs[-1]:
        return points[xs[-1]]
    for low, high in zip(xs, xs[1:], strict=False):
        if low <= n <= high:
            return points[low] + (points[high] - points[low]) * (n - low) / (high - low)
    raise AssertionError("unreachable")


class Timer:
    """Builds one real-size model at a time and times its calls: (model, call) -> {n: seconds}."""

    def __init__(self, device: torch.device, dtype: torch.dtype, repeats: int, slow_s: float, log=print):
        self.device, self.dtype, self.repeats, self.slow_s, self.log = device, dtype, repeats, slow_s, log
        self.timings: dict[tuple[str, str], dict[int, float]] = {}

    def _time(self, model: str, call: str, n: int, fn) -> None:
        seconds = time_call(fn, self.device, self.repeats, self.slow_s)
        self.timings.setdefault((model, call), {})[n] = seconds
        self.log(f"  {model} {call} n={n}: {seconds * 1e3:.2f} ms")

    def gpt(self, name: str, config: GPTConfig, cfg_scale: float, calls: dict[str, list[int]]) -> None:
        """calls: 'start' / 'step' -> the n to time (start: [0])."""
        torch.manual_seed(0)
        model = GPT(config).to(device=self.device, dtype=self.dtype).eval()
        cond = torch.randn(1, config.cond_len, config.caption_dim, device=self.device)
        if config.cond_type in ("words", "class"):
            raise ValueError("the cost model times feature-conditioned GPTs (t5, tatok)")
        if "start" in calls:
            self._time(name, "start", 0, lambda: model.start(cond, cfg_scale))
        state = model.start(cond, cfg_scale)
        tokens = torch.randint(0, config.vocab_size, (1, config.num_tokens), device=self.device)
        positions = torch.arange(config.num_tokens, device=self.device)
        for n in calls.get("step", []):
            self._time(name, "step", n, lambda n=n: model.step(state, tokens[:, :n], positions[:n]))

    def head(self, name: str, config: EagleHeadConfig, cfg_scale: float, ns: list[int]) -> None:
        torch.manual_seed(0)
        head = EagleHead(config).to(device=self.device, dtype=self.dtype).eval()
        rows = 2 if cfg_scale != 1.0 else 1
        state = head.start(rows, cfg_scale, 1)
        size = config.grid_size[0] * config.grid_size[1]
        features = torch.randn(rows, size, config.dim, device=self.device, dtype=self.dtype)
        positions = torch.arange(size)
        for n in ns:
            self._time(
                name, "step", n,
                lambda n=n: head.step(state, features[:, :n], features[:, :n], positions[:n]),
            )  # fmt: skip

    def upsampler(self, name: str, config: UpsamplerConfig, low_grid: tuple[int, int], ns: list[int]) -> None:
        """ns: low-res tokens fed (whole rows of the low-res grid, from row 0)."""
        torch.manual_seed(0)
        model = Upsampler(config).to(self.device).eval()
        width = low_grid[1]
        ids = torch.randint(0, config.codebook_size, (1, *low_grid), device=self.device)
        for n in ns:
            rows = max(1, min(low_grid[0], -(-n // width)))
            self._time(name, "upsample_rows", n, lambda rows=rows: model.upsample_rows(ids[:, :rows], 0))

    def downsampler(self, name: str, config: DownsamplerConfig, grid: tuple[int, int], ns: list[int]) -> None:
        """ns: high-res tokens fed (whole groups of r rows)."""
        torch.manual_seed(0)
        model = Downsampler(config).to(self.device).eval()
        group = config.r * grid[1]
        ids = torch.randint(0, config.codebook_size, (1, *grid), device=self.device)
        for n in ns:
            rows = config.r * max(1, min(grid[0] // config.r, -(-n // group)))
            self._time(name, "downsample", n, lambda rows=rows: model.downsample(ids[:, :rows]))
