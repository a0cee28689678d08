"""The token grid as one model's slot cache sees it, and the filler that samples groups of rows of it: the
helpers shared by MuLo-SD (drafting, island resampling; mulo.py) and LANTERN (lantern.py).

A slot that holds an outdated token is rewritten by the next call of that model reaching past it (`stale`),
so no call is spent on rewrites alone.
"""

from __future__ import annotations

import torch

from mulo_sd.decoding.sampling import SamplerConfig, process_logits, sample

NOTHING = -1  # SlotGrid: no token (value not sampled yet / slot never written)
STAND_IN = -2  # SlotGrid.written: the slot holds a ZipAR stand-in
OUTDATED = -3  # SlotGrid.written: the slot must be rewritten (its low-res row changed)


class SlotGrid:
    """One image's token grid as one model sees it: the current token of every grid position (`values`,
    NOTHING while unknown) and the token whose K/V that model's slot holds (`written`). int64 [N], CPU."""

    def __init__(self, size: int):
        self.values = torch.full((size,), NOTHING, dtype=torch.long)
        self.written = torch.full((size,), NOTHING, dtype=torch.long)

    def stale(self, below: int) -> list[int]:
        """Positions < below with a known token that their slot does not hold."""
        values, written = self.values[:below], self.written[:below]
        return ((values >= 0) & (written != values)).nonzero()[:, 0].tolist()

    def forget(self, state, first: int) -> None:
        """Drop positions >= first: unknown values, slots unwritten (the cache's mask stops showing them)."""
        self.values[first:] = NOTHING
        self.written[first:] = NOTHING
        state.written[:, state.cond_len + first :] = False


def step_grid(model, state, grid: SlotGrid, positions: list[int]) -> torch.Tensor:
    """One `step` feeding the grid's current tokens at `positions` (sorted, distinct) -> guided logits [n, V]
    of batch row 0. An unknown token is replaced by the newest known token before it (ZipAR stand-in)."""
    index = torch.tensor(positions, dtype=torch.long)
    tokens = grid.values[index].clone()
    for i in (tokens < 0).nonzero()[:, 0].tolist():
        tokens[i] = grid.values[(grid.values[: positions[i]] >= 0).nonzero()[-1, 0]]
    device = state.first_logits.device
    logits = model.step(state, tokens[None].to(device), index.to(device))
    grid.written[index] = torch.where(grid.values[index] < 0, STAND_IN, tokens)
    return logits[0]


def fill(
    model,
    state,
    grid: SlotGrid,
    groups: list[list[list[int]]],
    window: int | None,
    sampler: SamplerConfig,
    generator: torch.Generator,
    known: dict[int, torch.Tensor] | None = None,
    split: bool = False,
) -> None:
    """Sample every position of `groups` into grid.values with `model`. A group is a list of rows, a row a
    list of raster positions (left to right). Every step samples the next position of each active row: row
    i of a group is active once row i - 1 is complete (`window` None: raster order in the group) or holds
    `window` tokens (ZipAR). Position u is drawn from the query at u - 1 (u = 0: `state.first_logits`) or from
    `known` (processed distributions valid in the current context, e.g. the verification's, used at the first
    step). Each call also rewrites the stale slots below its queries. `split`: one call per run of fed
    positions of one group instead of one call per step (same contexts, more calls)."""
    known = dict(known or {})
    owner = {p: g for g, rows in enumerate(groups) for row in rows for p in row}
    filled = [[0] * len(rows) for rows in groups]
    while True:
        queries = []  # (position, group, row)
        for g, rows in enumerate(groups):
            for i, row in enumerate(rows):
                if filled[g][i] == len(row):
                    continue
                above = len(rows[i - 1]) if window is None else min(window, len(rows[i - 1]))
                if i == 0 or filled[g][i - 1] >= above:
                    queries.append((row[filled[g][i]], g, i))
        if not queries:
            return
        queries.sort()
        probs = {}
        for u, _, _ in queries:
            if u in known:
                probs[u] = known.pop(u)
            elif u == 0:
                probs[u] = process_logits(state.first_logits[0], sampler)
        asks = [u for u, _, _ in queries if u not in probs]
        if asks:
            feeds = {u - 1: owner[u] for u in asks}  # fed position -> group it serves
            for p in grid.stale(below=max(feeds)):
                feeds.setdefault(p, owner.get(p, -1))
            positions = sorted(feeds)
            calls = _runs(positions, feeds) if split else [positions]
            outputs = {}
            for call in calls:
                outputs.update(zip(call, step_grid(model, state, grid, call), strict=True))
            asked = process_logits(torch.stack([outputs[u - 1] for u in asks]), sampler)
            probs.update(zip(asks, asked, strict=True))
        tokens = sample(torch.stack([probs[u] for u, _, _ in queries]), generator).cpu()
        grid.values[[u for u, _, _ in queries]] = tokens
        for _, g, i in queries:
            filled[g][i] += 1


def _runs(positions: list[int], owners: dict[int, int]) -> list[list[int]]:
    """Split sorted positions into maximal runs of consecutive entries with the same owner."""
    runs: list[list[int]] = []
    for p in positions:
        if runs and owners[runs[-1][-1]] == owners[p]:
            runs[-1].append(p)
        else:
            runs.append([p])
    return runs
