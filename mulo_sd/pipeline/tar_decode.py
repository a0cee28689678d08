"""Tar text-to-image in two stages, each with its own statistics record (docs/tar.md):

1. `mllm`: Tar's MLLM (mulo_sd/tar/mllm.py) writes a prompt's TA-Tok tokens and returns their features;
2. `ar_dtok`: a decoding method (mulo_sd/pipeline/decode_entry.py) runs the AR-DTok GPTs under those
features, the target
   and every drafter conditioned on the same ones, and the VQ decodes the image.

    result = decode_tar("mulo", models, ["a corgi on a beach"], {"r": 4}, SamplerConfig(cfg_scale=4.0),
                        SamplerConfig(top_k=1200, top_p=0.95), seed=0, compare_ar=True)
    result.as_dict()  # mllm/<statistic>, ar_dtok/<statistic>, end_to_end_wall_s, speedups

MuLo-SD accelerates the second stage, so its speedup is measured there: `compare_ar=True` decodes stage 2
again with plain AR on the same features and reports `ar_dtok/speedup` (AR's wall time over the method's)
and `end_to_end/speedup` (with stage 1's time added to both sides).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mulo_sd.decoding.methods import DecodeResult
from mulo_sd.decoding.sampling import SamplerConfig
from mulo_sd.decoding.stats import DecodeStats
from mulo_sd.pipeline.decode_entry import decode
from mulo_sd.pipeline.model_set import Models
from mulo_sd.pipeline.roles import MLLM

STAGES = ("mllm", "ar_dtok")


@dataclass
class TarResult:
    ids: torch.Tensor  # int64 [B, N]: the MLLM's TA-Tok tokens
    features: torch.Tensor  # [B, N, clip_dim]: their features, the AR-DTok's condition
    result: DecodeResult  # stage 2: VQ tokens, image, its statistics
    mllm_stats: DecodeStats
    reference: DecodeResult | None = None  # stage 2 by plain AR on the same features (compare_ar)

    @property
    def stages(self) -> dict[str, DecodeStats]:
        return {"mllm": self.mllm_stats, "ar_dtok": self.result.stats}

    def as_dict(self) -> dict[str, int | float | str]:
        """Every statistic of each stage under its stage prefix, the end-to-end wall time and, with a
        reference, the speedups of stage 2 and end to end."""
        row: dict[str, int | float | str] = {}
        for stage, stats in self.stages.items():
            row.update({f"{stage}/{name}": value for name, value in stats.as_dict().items()})
        first, second = self.mllm_stats.wall_seconds, self.result.stats.wall_seconds
        row["end_to_end_wall_s"] = first + second
        if self.reference is not None:
            ar = self.reference.stats.wall_seconds
            row["ar_dtok/ar_wall_s"] = ar
            row["ar_dtok/speedup"] = ar / second
            row["end_to_end/speedup"] = (first + ar) / (first + second)
        return row


def decode_tar(
    method: str,
    models: Models,
    prompts: list[str],
    knobs: dict,
    sampler: SamplerConfig,
    mllm_sampler: SamplerConfig,
    seed: int,
    compare_ar: bool = False,
    compile: bool | str = False,
) -> TarResult:
    """Stage 1 with `mllm_sampler`, then `method` with `knobs` and `sampler` on the AR-DTok stage (`compile`:
    through compiled steps, decode_entry.decode); each stage draws from its own generator seeded with `seed`,
    so a decode repeats exactly."""
    mllm = models.require(MLLM, "Tar's MLLM writes the TA-Tok tokens of the prompt")
    target = models.require("target")
    if not prompts or not all(isinstance(p, str) and p.strip() for p in prompts):
        raise ValueError(f"prompts must be a non-empty list of non-empty strings, got {prompts!r}")
    stats = DecodeStats(batch_size=len(prompts), device=target.device)
    generator = torch.Generator(device=target.device).manual_seed(seed)
    ids, features = mllm.generate(prompts, sampler=mllm_sampler, generator=generator, stats=stats)
    config = target.config
    wanted = (len(prompts), config.cond_len, config.caption_dim)
    if tuple(features.shape) != wanted:
        raise ValueError(
            f"the MLLM wrote TA-Tok features of shape {list(features.shape)}, but the AR-DTok target takes "
            f"[{len(prompts)}, cond_len={config.cond_len}, caption_dim={config.caption_dim}]: convert the "
            f"AR-DTok with `mulo-convert tar-ar-dtok ... --cond-len {features.shape[1]}` (Tar's scales: 729, "
            f"169, 81 tokens)"
        )
    condition = (features.to(target.device), None)
    result = decode(method, models, prompts, knobs, sampler, seed, condition=condition, compile=compile)
    reference = None
    if compare_ar:
        reference = decode("ar", models, prompts, {}, sampler, seed, condition=condition, compile=compile)
    return TarResult(ids, features, result, stats, reference)
