"""ZipAR parallel decoding (He et al., 2024): rows of the grid decode concurrently, staggered by a window.

Schedule (docs/algorithm.md section 12), grid h x w, window W (clamped to w):
- every row decodes left to right; row j+1 starts in the call after row j holds W tokens (this holds for
  row 0 too, so row 1 starts while row 0 is still running);
- each target call feeds, at its own raster slot, the newest token of every active row and samples the next
  token of every active row. A row's last token is fed once more in the following call so that its K/V is
  written for the rows below; its output is only used when it predicts the first token of the next row.
Row j's token c is sampled in call j*W + c + 1 (call 1 is `start`), so the target is called
`w + (h - 1) * W` times instead of `h * w`.

Stand-in for the first token of a new row: that token is predicted by the output at the slot just before
it, the end of the row above, which is not decoded yet when W < w. We feed, at that slot, the newest token
of the row above (the one fed at its own slot in the same call), as ZipAR's public LlamaGen code does; the
slot is overwritten with the real token when the row above completes (the slot cache allows overwrites).
Differences from that code: its row 0 is decoded completely before row 1 starts (2w + (h - 2) * W calls);
here row 1 starts after W tokens of row 0, like every other row. With W >= w no stand-in is ever fed (each
row starts right after the row above completes), so the output equals `ar` token for token under greedy
sampling.
"""

from __future__ import annotations

import torch

from mulo_sd.decoding.methods.instrumented import Recorded
from mulo_sd.decoding.methods.result import DecodeResult, finish
from mulo_sd.decoding.sampling import SamplerConfig, process_logits
from mulo_sd.decoding.sampling import sample_rows as sample  # a list of generators: one per row
from mulo_sd.decoding.stats import DecodeStats


def zipar_target_forwards(grid_size: tuple[int, int], window: int) -> int:
    """Number of target calls (`start` included) ZipAR needs on an h x w grid."""
    h, w = grid_size
    return w + (h - 1) * min(window, w)


@torch.inference_mode()
def decode_zipar(
    model,
    cond: torch.Tensor,
    sampler: SamplerConfig,
    generator: torch.Generator | list[torch.Generator],
    window: int,
    cond_mask: torch.Tensor | None = None,
    tokenizer=None,
) -> DecodeResult:
    """ZipAR decoding with window `window` (>= 1; values >= w decode row after row, like `ar`)."""
    if window < 1:
        raise ValueError(f"ZipAR window must be >= 1 token, got {window}")
    h, w = model.grid_size
    window = min(window, w)
    batch = cond.shape[0]
    device = cond.device
    stats = DecodeStats(batch_size=batch, device=device)
    model = Recorded(model, "target", stats)
    grid = torch.full((batch, h * w), -1, dtype=torch.long, device=device)  # raster order; -1: not sampled
    filled = [0] * h  # tokens sampled per row
    written = [0] * h  # tokens of the row whose K/V is in the cache
    with stats.wall():
        with stats.phase("prefill"):
            state = model.start(cond, sampler.cfg_scale, cond_mask=cond_mask)
            grid[:, 0] = sample(process_logits(state.first_logits, sampler), generator)
            filled[0] = 1
        with stats.phase("decode"):
            while filled[h - 1] < w:
                # fed token i: grid index sources[i] goes to slot slots[i]; its output predicts the grid
                # index targets[i] (None: output unused)
                sources, slots, targets = [], [], []
                for row in range(h):
                    newest = row * w + filled[row] - 1
                    if written[row] < filled[row]:  # the newest token of this row, at its own slot
                        sources.append(newest)
                        slots.append(newest)
                        next_row_waits = row + 1 < h and filled[row + 1] == 0
                        targets.append(newest + 1 if filled[row] < w or next_row_waits else None)
                    if row + 1 < h and filled[row + 1] == 0 and window <= filled[row] < w:
                        sources.append(newest)  # stand-in at the end of this row, predicting the next row
                        slots.append((row + 1) * w - 1)
                        targets.append((row + 1) * w)
                written = list(filled)
                logits = model.step(state, grid[:, sources], torch.tensor(slots, device=device))
                used = [i for i, target in enumerate(targets) if target is not None]
                predicted = [targets[i] for i in used]
                grid[:, predicted] = sample(process_logits(logits[:, used], sampler), generator)
                for index in predicted:
                    filled[index // w] += 1
    return finish(grid.view(batch, h, w), stats, tokenizer)
