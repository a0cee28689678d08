"""Plain autoregressive decoding with the slot KV cache: one target call per token. The speed reference."""

from __future__ import annotations

import torch

from mulo_sd.decoding.methods.instrumented import Recorded
from mulo_sd.decoding.methods.result import DecodeResult, finish
from mulo_sd.decoding.sampling import SamplerConfig, process_logits, sample_rows
from mulo_sd.decoding.stats import DecodeStats


@torch.inference_mode()
def decode_ar(
    model,
    cond: torch.Tensor,
    sampler: SamplerConfig,
    generator: torch.Generator | list[torch.Generator],
    cond_mask: torch.Tensor | None = None,
    tokenizer=None,
) -> DecodeResult:
    """Sample the h x w grid in raster order: `start` predicts token 0, then one `step` per token.

    Target calls: 1 + (h*w - 1); every call is on the critical path.
    """
    h, w = model.grid_size
    batch = cond.shape[0]
    stats = DecodeStats(batch_size=batch, device=cond.device)
    model = Recorded(model, "target", stats)
    tokens = torch.empty(batch, h * w, dtype=torch.long, device=cond.device)
    positions = torch.arange(h * w, device=cond.device)
    with stats.wall():
        with stats.phase("prefill"):
            state = model.start(cond, sampler.cfg_scale, cond_mask=cond_mask)
            tokens[:, 0] = sample_rows(process_logits(state.first_logits, sampler), generator)
        with stats.phase("decode"):
            for i in range(h * w - 1):
                logits = model.step(state, tokens[:, i : i + 1], positions[i : i + 1])
                tokens[:, i + 1] = sample_rows(process_logits(logits[:, 0], sampler), generator)
    return finish(tokens.view(batch, h, w), stats, tokenizer)
