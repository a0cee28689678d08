"""MuLo-SD: multi-scale local speculative decoding (docs/algorithm.md sections 4-9).

One cycle, until the high-res grid (target, H x W) is full:
1. draft: the drafter (grid h x w = H/r x W/r, its own slot cache, same condition) samples the next
   `rows_per_cycle` low-res rows (default: all remaining), serially or ZipAR-style (`draft_window`);
2. up-sample: `upsampler.upsample_rows` turns them into r * rows new high-res rows (`draft_temperature` > 0:
   drawn from `upsample_rows_logits` / temperature with the decode's generator instead of their argmax; None:
   the up-sampler's own `config.draft_temperature`, 0 for one without);
3. verify: ONE target `step` over the cycle: the token at grid position p is fed at slot p, and draft
   position p is judged by the output at p - 1 (position 0 by `state.first_logits`), processed by
   `process_logits` exactly as plain AR sampling would;
4. accept rule (accept.py): accept p iff p_p(B_k(x_p)) >= tau (`accept_rule` 'absolute', the paper's) or
   >= tau * exp(-H(p_p)) ('typical': the bar drops where the target is unsure); `accept_floor` keeps either
   bar at or above itself (0: off);
5. rejection, by `rejection`:
   - 'raster' (LANTERN-style prefix acceptance): keep the drafts before the first rejection t0, sample t0
     from the verified distribution at t0, discard everything after t0 (re-drafted next cycle);
   - 'local' / 'naive': R_X = union of N(t, l) over rejected t, u >= t0, this cycle's positions only
     ('naive' is l = 0); its 8-connected islands (islands.py) are resampled by the target, each in raster
     order within the island, all islands advancing together: one `step` per step feeds, at their own slots,
     the token before each island's next position (its query) plus every resampled token whose slot still
     holds the rejected one. The first position of every island is sampled from the verification output
     (nothing before it has changed yet). `island_zipar_window` fills the rows of an island ZipAR-style (row
     i + 1 starts once row i holds that many tokens). Accepted tokens after t0 keep the K/V computed in the
     verification unless `refresh_after_resample` (one more `step` rewriting every slot from t0 on);
6. commit: accepted + resampled tokens join the high-res prefix; the complete low-res rows under it are
   `downsampler.downsample`d and become the drafter's prefix; low-res rows whose tokens changed are rewritten
   in the drafter's cache (together with the next draft call, so no extra drafter call).

Interfaces (duck-typed): upsampler.r, .codebook_size, .upsample_rows(ids_low [1, n, w], first_row) ->
[1, r * (n - first_row), W] and, for `draft_temperature` > 0, .upsample_rows_logits (the same rows' logits
[1, V, r * (n - first_row), W]) (an up-sampler with `conditioned` true also gets `cond=`, `cond_mask=`: the
caption as the target takes it; one with `hypotheses` > 1 gets `hypothesis=`, int64 [1], drawn once per image
from its generator); downsampler.r, .codebook_size, .downsample(ids_high [1, r * n, W]) ->
[1, n, w],
called on the committed complete row groups only, once per cycle that completes new ones and never after the
last cycle. Only a cycle that ends before the grid is full calls it (`uses_downsampler`: rejection='raster'
or a `rows_per_cycle`, e.g. the testbed set's 4); this function's default, one cycle over the whole grid with
'local' / 'naive' rejection, never does and takes `downsampler=None`. The drafter samples with the same
SamplerConfig as the target (guidance included), or under its own guidance scale `drafter_cfg_scale`: a
stronger one draws more of the caption's objects into the draft, at the cost of backgrounds further from the
scenes (docs/testbed.md, "Drafter guidance").

Project decisions:
- raster, partially committed rows: the drafter's prefix is the low-res rows whose r high-res rows are all
  committed; the next cycle re-drafts from the first low-res row that is not (its cache slots from there on
  are cleared first, so ZipAR drafting never sees discarded drafts); in the up-sampled rows, positions that
  are already committed keep their committed token and are neither drafted nor verified again.
- A slot that holds an outdated token (the last resampled token of an island, the target's resampled t0,
  the drafter's last drafted token, a down-sampled row that changed) is rewritten by the next call of that
  model that reaches past it, e.g. by the next verification; no call is spent on it alone.
- ZipAR stand-in (drafting): the first token of a low-res row that starts before the row above is complete is
  predicted from the slot at the end of the row above, fed with the newest token of that row (as zipar.py);
  the real token overwrites it later. In an island the current (draft) token plays that role.
- `parallel=False` issues the same queries as separate calls, one per island (a call is split where another
  island's fed position lies between two of its own), so every query sees exactly the context of the batched
  call and the tokens are the same as with `parallel=True`; only the call count grows. Filling whole islands
  one after another would change the context later islands see.
- The rows of a batch are decoded together (methods/lockstep.py, docs/batching.md): each image runs its own
  schedule (accept patterns differ) with its own generator (`generator`: a list, one per image), and every
  round of model calls is batched across the images (per-row positions, idle images padded); image b's
  tokens equal decoding it alone. One generator for the batch, or models without `step_rows`: the images
  are decoded one at a time, the statistics merged with `DecodeStats.add`.

Statistics (the call counts and sequential_steps recorded by the model wrappers, methods/instrumented.py):
target_forwards = target `start` + verifications + island steps + refreshes; drafter_forwards = drafter
`start` + draft calls; sequential_steps counts every model, up-sampler and down-sampler call (each waits on
the one before it); tokens_drafted = positions verified; tokens_accepted = draft tokens kept as
final; tokens_rejected = positions failing the accept rule (raster: the first one, t0, as later positions
are discarded unjudged); tokens_resampled = positions the target sampled (islands; raster: t0);
islands_per_cycle / island_sizes: the islands of each cycle (raster: {t0} counts as one island of size 1).
Every high-res position ends as exactly one kept draft or one resampled token: tokens_accepted +
tokens_resampled = H * W per image.
Phases: prefill (both `start`s), draft, upsample, verify, resample, refresh, downsample.

Exactness: with greedy sampling (temperature 0), k = 0 and tau = 1 (accept iff the draft is the argmax, under
either accept_rule),
'raster' returns exactly the tokens of greedy `decode_ar`: every kept token and t0 are judged in an exact
context. 'local' / 'naive' are exact up to and including t0 only: tokens after an island were judged with the
rejected drafts as context and are kept. They are fully exact when every cycle's islands cover all positions
from t0 on (e.g. l >= max(H, W)): then the resampling is plain AR decoding of the tail.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from mulo_sd.decoding.accept import accept_pooled, check_neighbour_knobs
from mulo_sd.decoding.islands import expand_rejections, find_islands
from mulo_sd.decoding.methods.grid_fill import NOTHING, OUTDATED, SlotGrid, fill, step_grid
from mulo_sd.decoding.methods.instrumented import DOWNSAMPLER, UPSAMPLER, Recorded
from mulo_sd.decoding.methods.lockstep import decode_images
from mulo_sd.decoding.methods.mulo_checks import check_knobs, check_models, own_draft_temperature
from mulo_sd.decoding.methods.result import DecodeResult, finish
from mulo_sd.decoding.sampling import SamplerConfig, image_generators, per_image, process_logits, sample
from mulo_sd.decoding.stats import DecodeStats


@dataclass
class Knobs:
    """decode_mulo's settings, validated (see its docstring)."""

    r: int
    tau: float
    accept_rule: str
    accept_floor: float
    k: int
    neighbours: torch.Tensor
    l: int
    rejection: str
    rows_per_cycle: int | None
    draft_window: int | None
    island_zipar_window: int | None
    refresh_after_resample: bool
    parallel: bool
    drafter_sampler: SamplerConfig
    draft_temperature: float


@torch.inference_mode()
def decode_mulo(
    target,
    drafter,
    upsampler,
    downsampler,
    cond: torch.Tensor,
    sampler: SamplerConfig,
    generator: torch.Generator,
    *,
    tau: float,
    k: int,
    neighbours: torch.Tensor,
    accept_rule: str = "absolute",
    accept_floor: float = 0.0,
    l: int = 1,
    rejection: str = "local",
    rows_per_cycle: int | None = None,
    draft_window: int | None = None,
    island_zipar_window: int | None = None,
    refresh_after_resample: bool = False,
    parallel: bool = True,
    drafter_cfg_scale: float | None = None,
    draft_temperature: float | None = None,
    cond_mask: torch.Tensor | None = None,
    tokenizer=None,
) -> DecodeResult:
    """MuLo-SD decoding of the target's grid (module docstring); `neighbours`: [V, K >= k] (neighbours.py)."""
    windows = (rows_per_cycle, draft_window, island_zipar_window)
    draft_temperature = own_draft_temperature(upsampler) if draft_temperature is None else draft_temperature
    check_knobs(rejection, accept_rule, (tau, accept_floor), l, windows, draft_temperature)
    r = check_models(target, drafter, upsampler, downsampler, rejection, rows_per_cycle, draft_temperature)
    drafter_sampler = sampler if drafter_cfg_scale is None else replace(sampler, cfg_scale=drafter_cfg_scale)
    check_neighbour_knobs(neighbours, k, target.vocab_size)
    knobs = Knobs(
        r=r,
        tau=tau,
        accept_rule=accept_rule,
        accept_floor=accept_floor,
        k=k,
        neighbours=neighbours.to(cond.device),  # once, not per cycle
        l=0 if rejection == "naive" else l,
        rejection=rejection,
        rows_per_cycle=rows_per_cycle,
        draft_window=draft_window,
        island_zipar_window=island_zipar_window,
        refresh_after_resample=refresh_after_resample,
        parallel=parallel,
        drafter_sampler=drafter_sampler,
        draft_temperature=draft_temperature,
    )
    generators = image_generators(generator, cond.shape[0])
    models = {"target": target, "drafter": drafter, "upsampler": upsampler, "downsampler": downsampler}

    def job(i: int, models: dict):
        image = ImageDecode(*models.values(), sampler, generators[i], knobs, cond.device)
        return image.run(cond[i : i + 1], None if cond_mask is None else cond_mask[i : i + 1]), image.stats

    images, stats = decode_images(job, models, cond.shape[0], cond.device, per_image(generator))
    tokens = torch.stack(images).view(cond.shape[0], *target.grid_size).to(cond.device)
    return finish(tokens, stats, tokenizer)


class ImageDecode:
    """One image (batch of 1) decoded with MuLo-SD: the models, both grids and the statistics."""

    def __init__(self, target, drafter, upsampler, downsampler, sampler, generator, knobs: Knobs, device):
        self.stats = stats = DecodeStats(batch_size=1, device=device)
        self.target, self.drafter = Recorded(target, "target", stats), Recorded(drafter, "drafter", stats)
        self.upsampler = Recorded(upsampler, "upsampler", stats, UPSAMPLER)
        self.downsampler = Recorded(downsampler, "downsampler", stats, DOWNSAMPLER)  # None: never called
        self.sampler, self.generator, self.knobs = sampler, generator, knobs
        self.height, self.width = target.grid_size
        self.low_height, self.low_width = drafter.grid_size
        self.high = SlotGrid(self.height * self.width)
        self.low = SlotGrid(self.low_height * self.low_width)
        self.device = device

    def run(self, cond: torch.Tensor, cond_mask: torch.Tensor | None) -> torch.Tensor:
        """-> tokens int64 [H*W] on CPU."""
        stats, knobs, size, r = self.stats, self.knobs, self.height * self.width, self.knobs.r
        # what the up-sampler reads besides the low-res rows: the target's condition for one that reads the
        # caption (nets/caption_film.py); the hypothesis this image drafts for one of several, drawn once so
        # that every cycle's rows commit to the same one
        self.upsampler_inputs = {}
        if getattr(self.upsampler, "conditioned", False):
            self.upsampler_inputs = {"cond": cond, "cond_mask": cond_mask}
        hypotheses = getattr(self.upsampler, "hypotheses", 1)
        if hypotheses > 1:
            pick = torch.randint(hypotheses, (1,), generator=self.generator, device=self.generator.device)
            self.upsampler_inputs["hypothesis"] = pick.to(self.device)
        with stats.wall():
            with stats.phase("prefill"):
                self.target_state = self.target.start(cond, self.sampler.cfg_scale, cond_mask=cond_mask)
                drafter_cfg = knobs.drafter_sampler.cfg_scale
                self.drafter_state = self.drafter.start(cond, drafter_cfg, cond_mask=cond_mask)
            committed = 0  # high-res positions committed: always a raster prefix
            prefix_rows = 0  # low-res rows the drafter holds as its (down-sampled) prefix
            while committed < size:
                stats.cycles += 1
                first_row = prefix_rows
                last_row = self.low_height
                if knobs.rows_per_cycle is not None:
                    last_row = min(last_row, first_row + knobs.rows_per_cycle)
                with stats.phase("draft"):
                    self.draft(first_row, last_row)
                start, end = committed, last_row * r * self.width
                with stats.phase("upsample"):
                    self.upsample(first_row, last_row, start, end)
                with stats.phase("verify"):
                    probs = self.verify(start, end)
                    draft = self.high.values[start:end]
                    passed = accept_pooled(
                        probs,
                        draft,
                        knobs.neighbours,
                        knobs.k,
                        knobs.tau,
                        knobs.accept_rule,
                        knobs.accept_floor,
                    )
                    failed = (~passed).nonzero()[:, 0].cpu()
                if knobs.rejection == "raster":
                    committed = self.reject_raster(probs, failed, start, end)
                else:
                    self.reject_local(probs, failed, start, end)
                    committed = end
                if committed < size:
                    with stats.phase("downsample"):
                        prefix_rows = self.rewind_drafter(committed, prefix_rows, last_row)
        return self.high.values.clone()

    def draft(self, first_row: int, last_row: int) -> None:
        """The drafter samples low-res rows [first_row, last_row), serially or ZipAR-style."""
        width, window = self.low_width, self.knobs.draft_window
        rows = [list(range(j * width, (j + 1) * width)) for j in range(first_row, last_row)]
        sampler = self.knobs.drafter_sampler
        fill(self.drafter, self.drafter_state, self.low, [rows], window, sampler, self.generator)

    def upsample(self, first_row: int, last_row: int, start: int, end: int) -> None:
        """Up-sample the new low-res rows; positions [start, end) of their high-res rows become the draft."""
        prefix = self.low.values[: last_row * self.low_width].view(1, last_row, self.low_width)
        temperature = self.knobs.draft_temperature
        if temperature > 0:
            logits = self.upsampler.upsample_rows_logits(
                prefix.to(self.device), first_row, **self.upsampler_inputs
            )
            probs = process_logits(logits.movedim(1, -1), SamplerConfig(temperature=temperature))
            new_rows = sample(probs, self.generator)
        else:
            new_rows = self.upsampler.upsample_rows(
                prefix.to(self.device), first_row, **self.upsampler_inputs
            )
        new_rows = new_rows.reshape(-1).cpu()
        self.high.values[start:end] = new_rows[start - first_row * self.knobs.r * self.width :]
        self.stats.tokens_drafted += end - start

    def verify(self, start: int, end: int) -> torch.Tensor:
        """One teacher-forced target `step` over draft positions [start, end) -> processed p [n, V]."""
        state = self.target_state
        queries = range(max(start - 1, 0), end - 1)  # the output at p - 1 judges draft position p
        positions = sorted({*queries, *self.high.stale(below=end - 1)})
        outputs = {}
        if positions:
            outputs = dict(zip(positions, step_grid(self.target, state, self.high, positions), strict=True))
        rows = [state.first_logits[0]] if start == 0 else []
        rows += [outputs[p - 1] for p in range(max(start, 1), end)]
        return process_logits(torch.stack(rows), self.sampler)

    def reject_raster(self, probs: torch.Tensor, failed: torch.Tensor, start: int, end: int) -> int:
        """Keep the drafts before the first rejection t0, sample t0, drop the rest; -> committed count."""
        stats = self.stats
        if failed.numel() == 0:
            stats.tokens_accepted += end - start
            stats.islands_per_cycle.append(0)
            return end
        first = int(failed[0])
        with stats.phase("resample"):
            self.high.values[start + first] = sample(probs[first], self.generator).cpu()
        self.high.values[start + first + 1 :] = NOTHING  # their target slots: overwritten by the next verify
        stats.tokens_accepted += first
        stats.tokens_rejected += 1
        stats.tokens_resampled += 1
        stats.islands_per_cycle.append(1)
        stats.island_sizes.append(1)
        return start + first + 1

    def reject_local(self, probs: torch.Tensor, failed: torch.Tensor, start: int, end: int) -> None:
        """Resample the islands of R_X in place (module docstring, step 5)."""
        stats, knobs, size = self.stats, self.knobs, self.height * self.width
        rejected = torch.zeros(size, dtype=torch.bool)
        rejected[start + failed] = True
        draft = torch.zeros(size, dtype=torch.bool)
        draft[start:end] = True
        grid = (self.height, self.width)
        resample = expand_rejections(rejected.view(grid), knobs.l, draft.view(grid))
        islands = find_islands(resample)
        count = int(resample.sum())
        stats.tokens_accepted += end - start - count
        stats.tokens_rejected += failed.numel()
        stats.tokens_resampled += count
        stats.islands_per_cycle.append(len(islands))
        stats.island_sizes.extend(sum(len(row) for row in island) for island in islands)
        if not islands:
            return
        with stats.phase("resample"):
            known = {island[0][0]: probs[island[0][0] - start] for island in islands}
            fill(
                self.target, self.target_state, self.high, islands, knobs.island_zipar_window, self.sampler,
                self.generator, known, split=not knobs.parallel,
            )  # fmt: skip
        if knobs.refresh_after_resample:
            with stats.phase("refresh"):
                positions = list(range(islands[0][0][0], end - 1))  # t0 .. the last one predicting a position
                if positions:
                    step_grid(self.target, self.target_state, self.high, positions)

    def rewind_drafter(self, committed: int, prefix_rows: int, last_row: int) -> int:
        """Give the drafter the low-res rows under the committed high-res rows; -> its prefix row count."""
        r, width, low_width, low = self.knobs.r, self.width, self.low_width, self.low
        complete = committed // width // r  # low-res rows whose r high-res rows are all committed
        if complete > prefix_rows:
            committed_rows = self.high.values[: complete * r * width].view(1, complete * r, width)
            new = self.downsampler.downsample(committed_rows.to(self.device)).reshape(-1).cpu()
            changed = (new != low.values[: complete * low_width]).view(complete, low_width).any(1)
            low.values[: complete * low_width] = new
            for row in changed.nonzero()[:, 0].tolist():  # rewritten by the next drafter call
                low.written[row * low_width : (row + 1) * low_width] = OUTDATED
        if complete < last_row:
            low.forget(self.drafter_state, complete * low_width)  # raster: these rows are drafted again
        return complete
