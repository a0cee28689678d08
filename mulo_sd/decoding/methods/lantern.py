"""LANTERN (Jang et al., 2024): relaxed speculative decoding with a same-resolution drafter
(docs/algorithm.md section 13), in raster order.

One cycle: the drafter samples `draft_len` tokens serially from its processed distributions q; ONE target
`step` feeds the last committed token and the drafts at their slots and yields the processed target
distributions p of every draft position and of the position after the last draft; drafts are accepted in
order with probability min(1, p~(v) / q(v)) (accept.py: p~ pools the mass of v's nearest codebook neighbours
up to delta); the first rejected position is resampled from norm(max(0, p - q')) and the rest of the draft
is dropped; when every draft is accepted the target samples the next position itself (the bonus token of
speculative sampling). With delta = 0 (or k = 0) this is exact speculative sampling: the tokens follow the
target's distribution, and with greedy sampling they equal greedy `decode_ar`'s (with greedy p is one-hot,
so the pooled neighbours carry no mass below any delta < 1 and that holds for every such delta).

All randomness (drafts, acceptance uniforms, resampling) comes from `generator`. Slots holding a dropped or
outdated token are rewritten by the next call of that model reaching past them (grid_fill.SlotGrid). The rows
of a batch are decoded together when `generator` is a list (one per image), each image with its own accept
lengths (methods/lockstep.py: image b's tokens equal decoding it alone); one generator for the batch, or
models without `step_rows`: one image at a time, the records merged with `DecodeStats.add`.

Statistics: target_forwards = `start` + one verification per cycle; drafter_forwards = `start` + draft
calls (the first position of the grid is drafted from the drafter's `start`); every call is on the critical
path (sequential_steps = target_forwards + drafter_forwards); tokens_accepted = drafts kept; tokens_rejected =
rejections (one per rejecting cycle); tokens_resampled = positions the target sampled itself (after a
rejection, or the bonus token), so tokens_accepted + tokens_resampled = H * W per image.
"""

from __future__ import annotations

import torch

from mulo_sd.decoding.accept import check_neighbour_knobs, lantern_relaxed_probability, lantern_residual
from mulo_sd.decoding.methods.grid_fill import NOTHING, SlotGrid, step_grid
from mulo_sd.decoding.methods.instrumented import Recorded
from mulo_sd.decoding.methods.lockstep import decode_images
from mulo_sd.decoding.methods.result import DecodeResult, finish
from mulo_sd.decoding.sampling import SamplerConfig, image_generators, per_image, process_logits, sample
from mulo_sd.decoding.stats import DecodeStats


@torch.inference_mode()
def decode_lantern(
    target,
    drafter,
    cond: torch.Tensor,
    sampler: SamplerConfig,
    generator: torch.Generator,
    *,
    k: int,
    delta: float,
    neighbours: torch.Tensor,
    draft_len: int,
    cond_mask: torch.Tensor | None = None,
    tokenizer=None,
) -> DecodeResult:
    """LANTERN decoding (module docstring); `neighbours`: a [V, K >= k] table from neighbours.py."""
    if tuple(target.grid_size) != tuple(drafter.grid_size):
        raise ValueError(f"LANTERN needs one grid: target {target.grid_size}, drafter {drafter.grid_size}")
    if target.vocab_size != drafter.vocab_size:
        raise ValueError(
            f"target and drafter vocabularies differ: {target.vocab_size} vs {drafter.vocab_size}"
        )
    if not 0.0 <= delta <= 1.0:
        raise ValueError(f"delta must lie in [0, 1] (a probability mass), got {delta}")
    if draft_len < 1:
        raise ValueError(f"draft_len must be >= 1 token per cycle, got {draft_len}")
    check_neighbour_knobs(neighbours, k, target.vocab_size)
    neighbours = neighbours.to(cond.device)  # once, not per cycle (LANTERN's table can be large)
    batch = cond.shape[0]
    generators = image_generators(generator, batch)

    def job(i: int, models: dict):
        mask = None if cond_mask is None else cond_mask[i : i + 1]
        return _decode_image(
            *models.values(), cond[i : i + 1], mask, sampler, generators[i], k, delta, neighbours, draft_len
        )

    images, stats = decode_images(
        job, {"target": target, "drafter": drafter}, batch, cond.device, per_image(generator)
    )
    height, width = target.grid_size
    return finish(torch.stack(images).view(batch, height, width).to(cond.device), stats, tokenizer)


def _decode_image(target, drafter, cond, cond_mask, sampler, generator, k, delta, neighbours, draft_len):
    """One image: -> (tokens int64 [H*W] on CPU, its statistics)."""
    height, width = target.grid_size
    size = height * width
    stats = DecodeStats(batch_size=1, device=cond.device)
    target, drafter = Recorded(target, "target", stats), Recorded(drafter, "drafter", stats)
    committed, drafts = SlotGrid(size), SlotGrid(size)  # the target's and the drafter's view of the grid
    with stats.wall():
        with stats.phase("prefill"):
            target_state = target.start(cond, sampler.cfg_scale, cond_mask=cond_mask)
            drafter_state = drafter.start(cond, sampler.cfg_scale, cond_mask=cond_mask)
        done = 0
        while done < size:
            stats.cycles += 1
            count = min(draft_len, size - done)
            with stats.phase("draft"):
                draft_probs = _draft(drafter, drafter_state, drafts, done, count, sampler, generator)
            draft = drafts.values[done : done + count].clone()
            committed.values[done : done + count] = draft
            stats.tokens_drafted += count
            with stats.phase("verify"):
                probs = _verify(target, target_state, committed, done, count, sampler)
                draft_probs = torch.stack(draft_probs)
                relaxed, pooled = lantern_relaxed_probability(probs[:count], draft, neighbours, k, delta)
                ratio = relaxed / draft_probs.gather(1, draft[:, None].to(probs.device))[:, 0]
                uniforms = torch.rand(count, generator=generator, device=generator.device).to(probs.device)
                rejected = (uniforms >= ratio).nonzero()[:, 0].cpu()
            accepted = int(rejected[0]) if rejected.numel() else count
            stats.tokens_accepted += accepted
            position = done + accepted  # the position the target samples itself, if any
            with stats.phase("resample"):
                if accepted < count:
                    residual = lantern_residual(
                        probs[accepted], draft_probs[accepted], int(draft[accepted]), neighbours, k,
                        float(pooled[accepted]),
                    )  # fmt: skip
                    committed.values[position] = sample(residual, generator).cpu()
                    stats.tokens_rejected += 1
                elif position < size:
                    committed.values[position] = sample(probs[count], generator).cpu()
            done = _commit(committed, drafts, position, stats)
    return committed.values.clone(), stats


def _draft(drafter, drafter_state, drafts: SlotGrid, done: int, count: int, sampler, generator) -> list:
    """The drafter samples positions [done, done + count) serially -> their processed distributions q."""
    draft_probs = []
    for p in range(done, done + count):
        if p == 0:
            logits = drafter_state.first_logits[0]
        else:
            positions = sorted({p - 1, *drafts.stale(below=p - 1)})
            logits = step_grid(drafter, drafter_state, drafts, positions)[positions.index(p - 1)]
        draft_probs.append(process_logits(logits, sampler))
        drafts.values[p] = sample(draft_probs[-1], generator).cpu()
    return draft_probs


def _verify(target, target_state, committed: SlotGrid, done: int, count: int, sampler) -> torch.Tensor:
    """ONE target `step` over the drafts -> processed p [count + 1, V] (or [count, V] at the grid's end) of
    every draft position and of the bonus position after the last draft."""
    size = committed.values.shape[0]
    # outputs at done - 1 .. done + count - 1 judge the drafts and predict the bonus position
    predicting = range(max(done - 1, 0), min(done + count, size - 1))
    positions = sorted({*predicting, *committed.stale(below=predicting.stop)})
    outputs = {}
    if positions:
        outputs = dict(zip(positions, step_grid(target, target_state, committed, positions), strict=True))
    rows = [target_state.first_logits[0]] if done == 0 else []
    rows += [outputs[p - 1] for p in range(max(done, 1), min(done + count + 1, size))]
    return process_logits(torch.stack(rows), sampler)


def _commit(committed: SlotGrid, drafts: SlotGrid, position: int, stats) -> int:
    """Commit the grid up to `position` (sampled by the target unless it is the grid's end) and give the
    drafter the committed tokens; -> the committed count."""
    size = committed.values.shape[0]
    if position < size:
        stats.tokens_resampled += 1
        done = position + 1
    else:
        done = size
    committed.values[done:] = NOTHING
    drafts.values[:done] = committed.values[:done]
    drafts.values[done:] = NOTHING
    return done
