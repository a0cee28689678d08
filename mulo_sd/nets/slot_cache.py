"""The explicit decode state of an AR model: a slot KV cache (docs/algorithm.md section 2).

One K/V slot per absolute sequence position: `cond_len` condition slots, then the h*w grid in raster order.
A step writes the K/V of each fed token at its slot (any order, overwrites allowed) and marks it written;
each query attends to every written slot at an index <= its own. Condition padding slots are never written.

With classifier-free guidance the rows are doubled: rows [0, B) are conditional, rows [B, 2B) the matching
unconditional ones. Callers only ever see B rows: `fork` and `select` keep both halves in step.
The models (`GPT`, `HFCausalLM`) hold no cache themselves; everything that changes during decoding is here.

Tree slots (EAGLE-2's draft trees, docs/eagle2.md): `add_tree_slots(n)` appends n scratch slots after the
grid. A tree step writes its nodes there (several nodes may share a grid position), each node attending to the
written grid slots before its position and to its ancestors in the tree (`tree_attention_mask`);
`commit_tree` then copies the K/V of the accepted path into the grid slots of their positions. K/V of a token
depend only on its own context, so the copies equal what a plain `step` of that path would have written.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mulo_sd.nets.guidance import guide


@dataclass
class DecodeState:
    keys: list[torch.Tensor]  # per layer [B', n_kv_head, S, head_dim]; B' = 2B with guidance, else B
    values: list[torch.Tensor]  # same shapes as keys
    written: torch.Tensor  # bool [B', S]
    cfg_scale: float
    cond_len: int  # slots before the grid; grid position p lives at slot cond_len + p
    first_logits: torch.Tensor  # [B, V] guided prediction for grid position 0
    first_hidden: torch.Tensor | None = None  # [B', dim] final hidden features predicting position 0 (GPT)
    tree_slots: int = 0  # scratch slots after the grid for tree steps (add_tree_slots)

    @classmethod
    def allocate(
        cls,
        n_layer: int,
        rows: int,
        n_kv_head: int,
        num_slots: int,
        head_dim: int,
        cond_len: int,
        cfg_scale: float,
        dtype: torch.dtype,
        device: torch.device,
    ) -> DecodeState:
        """Zeroed K/V for `rows` internal rows (already doubled for guidance), nothing written yet."""
        shape = (rows, n_kv_head, num_slots, head_dim)
        return cls(
            keys=[torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layer)],
            values=[torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layer)],
            written=torch.zeros(rows, num_slots, dtype=torch.bool, device=device),
            cfg_scale=cfg_scale,
            cond_len=cond_len,
            first_logits=torch.empty(0),
        )

    @property
    def guided(self) -> bool:
        return self.cfg_scale != 1.0

    @property
    def batch_size(self) -> int:
        """Rows as the caller sees them (half the internal rows under guidance)."""
        return self.written.shape[0] // (2 if self.guided else 1)

    @property
    def num_slots(self) -> int:
        """Condition and grid slots (the tree slots after them not counted)."""
        return self.written.shape[1] - self.tree_slots

    def add_tree_slots(self, n: int) -> None:
        """Give the state n scratch slots for tree steps (module docstring), in place; keeps more."""
        extra = n - self.tree_slots
        if extra <= 0:
            return
        rows, heads, _, head_dim = self.keys[0].shape

        def grow(cache: torch.Tensor) -> torch.Tensor:
            return torch.cat([cache, cache.new_zeros(rows, heads, extra, head_dim)], dim=2)

        self.keys = [grow(k) for k in self.keys]
        self.values = [grow(v) for v in self.values]
        self.written = torch.cat([self.written, self.written.new_zeros(rows, extra)], dim=1)
        self.tree_slots = n

    def tree_attention_mask(self, slots: torch.Tensor, parents: torch.Tensor, first: int = 0) -> torch.Tensor:
        """Bool mask [B', 1, n, S + tree_slots] for tree nodes first .. first+n-1 (node i in tree slot i) of a
        tree whose nodes 0 .. first+n-1 sit at grid `slots` [first+n] with `parents` [first+n] (earlier calls
        wrote nodes 0 .. first-1). A node sees its ancestors (itself included) and the written grid slots
        before its root's: the tree stands in for every position from its root on."""
        ancestors = tree_ancestors(parents)
        roots = ancestors.to(torch.uint8).argmax(1)  # the first ancestor: parents come before children
        bound = slots[roots][first:]
        index = torch.arange(self.num_slots, device=slots.device)
        before = self.written[:, None, : self.num_slots] & (index[None, :] < bound[:, None])
        tree = torch.zeros(bound.shape[0], self.tree_slots, dtype=torch.bool, device=slots.device)
        tree[:, : parents.shape[0]] = ancestors[first:]
        mask = torch.cat([before, tree.expand(before.shape[0], -1, -1)], dim=2)
        return mask.unsqueeze(1)

    def commit_tree(self, nodes: torch.Tensor, slots: torch.Tensor) -> None:
        """Copy the K/V of tree nodes `nodes` [m] (indices of the last tree step) into grid `slots` [m] and
        mark those written."""
        source = nodes.to(self.written.device) + self.num_slots
        slots = slots.to(self.written.device)
        for cache in (*self.keys, *self.values):
            cache.index_copy_(2, slots, cache.index_select(2, source))
        self.mark_written(slots)

    def mark_written(self, slots: torch.Tensor) -> None:
        self.written[:, slots] = True

    def attention_mask(self, slots: torch.Tensor) -> torch.Tensor:
        """Boolean mask [B', 1, n, S] (True = attend) for queries at `slots` [n]."""
        return visible_slots(self.written, slots)

    def guide(self, logits: torch.Tensor) -> torch.Tensor:
        """Internal-row logits [B', ...] -> guided logits [B, ...]."""
        if not self.guided:
            return logits
        cond, uncond = logits.chunk(2)
        return guide(cond, uncond, self.cfg_scale)

    def fork(self, n: int) -> DecodeState:
        """Every row repeated n times, in order row0 x n, row1 x n, ..."""
        if n < 1:
            raise ValueError(f"fork needs n >= 1, got {n}")
        return self._rows(torch.arange(self.batch_size).repeat_interleave(n))

    def select(self, indices) -> DecodeState:
        """A new state holding the rows `indices` (a list or 1-D integer tensor; repeats allowed)."""
        indices = torch.as_tensor(indices, dtype=torch.long).cpu().reshape(-1)
        if indices.numel() == 0:
            raise ValueError("select needs at least one row index")
        if indices.min() < 0 or indices.max() >= self.batch_size:
            raise ValueError(f"select indices must lie in [0, {self.batch_size}), got {indices.tolist()}")
        return self._rows(indices)

    def clone(self) -> DecodeState:
        return self._rows(torch.arange(self.batch_size))

    def _rows(self, index: torch.Tensor) -> DecodeState:
        device = self.written.device
        internal = torch.cat([index, index + self.batch_size]) if self.guided else index
        internal = internal.to(device)
        return DecodeState(
            keys=[k.index_select(0, internal) for k in self.keys],
            values=[v.index_select(0, internal) for v in self.values],
            written=self.written.index_select(0, internal),
            cfg_scale=self.cfg_scale,
            cond_len=self.cond_len,
            first_logits=self.first_logits.index_select(0, index.to(self.first_logits.device)),
            first_hidden=None if self.first_hidden is None else self.first_hidden.index_select(0, internal),
            tree_slots=self.tree_slots,
        )


def visible_slots(written: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Bool attention mask [B, 1, n, S] for queries at `slots` [n] (or [B, n]: every row its own) over the
    slots marked in `written` [B, S].

    A query sees written slots at indices <= its own, and always itself: condition padding slots are never
    written, yet their own query must attend to something (LlamaGen adds the same diagonal).
    """
    index = torch.arange(written.shape[1], device=slots.device)
    own = index == slots[..., None]
    causal = index <= slots[..., None]
    return ((written[:, None, :] | own) & causal).unsqueeze(1)


def check_row_step(
    state: DecodeState, tokens: torch.Tensor, positions: torch.Tensor, num_tokens: int, vocab_size: int
) -> torch.Tensor:
    """Validate the arguments of `step_rows` (positions [B, n], PADDING where a row feeds nothing) and return
    the slots [B, n]: grid position p at slot cond_len + p, padding at the state's first tree slot (after
    every grid slot, so no real query sees it; add_tree_slots(1) first)."""
    if not isinstance(positions, torch.Tensor) or positions.dim() != 2 or positions.is_floating_point():
        raise ValueError(f"positions must be a [B, n] integer tensor, got {_describe(positions)}")
    if tuple(tokens.shape) != tuple(positions.shape) or positions.shape[0] != state.batch_size:
        raise ValueError(
            f"tokens and positions must both be [batch={state.batch_size}, n], got {list(tokens.shape)} and "
            f"{list(positions.shape)}"
        )
    if state.tree_slots < 1:
        raise ValueError("step_rows writes padding into a tree slot: call state.add_tree_slots(1) first")
    cpu = positions.cpu()
    real = cpu != PADDING
    if ((cpu < 0) & real).any() or (cpu >= num_tokens).any():
        raise ValueError(f"positions must lie in [0, {num_tokens}) or be PADDING ({PADDING})")
    for row, mask in zip(cpu, real, strict=True):
        if row[mask].unique().numel() != int(mask.sum()):
            raise ValueError(f"positions must be distinct within each row, got {row.tolist()}")
    if tokens.min() < 0 or tokens.max() >= vocab_size:
        raise ValueError(f"tokens must lie in [0, {vocab_size}) (the vocabulary)")
    slots = torch.where(real, cpu + state.cond_len, state.num_slots)
    return slots.to(device=state.written.device, dtype=torch.long)


PADDING = -1  # step_rows: a row's entry that feeds nothing (written to a scratch slot, its output unused)


def tree_ancestors(parents: torch.Tensor) -> torch.Tensor:
    """parents [n] (the parent's node index, -1 for a root; parents come first) -> bool [n, n], True at
    [i, j] when node j is node i or one of its ancestors."""
    n = parents.shape[0]
    ancestors = torch.eye(n, dtype=torch.bool, device=parents.device)
    for i, parent in enumerate(parents.tolist()):
        if parent >= 0:
            ancestors[i] |= ancestors[parent]
    return ancestors


def check_tree(
    state: DecodeState, tokens: torch.Tensor, positions: torch.Tensor, parents: torch.Tensor, num_tokens: int,
    vocab_size: int,
) -> torch.Tensor:  # fmt: skip
    """Validate the arguments of a tree step (a `step` whose positions may repeat, tied by `parents` [n])
    and return the grid slots [n] of the nodes."""
    if not isinstance(positions, torch.Tensor) or positions.dim() != 1 or positions.is_floating_point():
        raise ValueError(f"positions must be a 1-D integer tensor (grid indices), got {_describe(positions)}")
    n = positions.shape[0]
    if not isinstance(parents, torch.Tensor) or tuple(parents.shape) != (n,) or parents.is_floating_point():
        raise ValueError(f"parents must be a 1-D integer tensor of {n} entries, got {_describe(parents)}")
    if not 1 <= n <= state.tree_slots:
        raise ValueError(
            f"a tree step needs 1 to {state.tree_slots} nodes (the state's tree slots, add_tree_slots), "
            f"got {n}"
        )
    if not isinstance(tokens, torch.Tensor) or tokens.is_floating_point():
        raise ValueError(f"tokens must be an integer tensor, got {_describe(tokens)}")
    if tuple(tokens.shape) != (state.batch_size, n):
        raise ValueError(
            f"tokens must have shape [batch={state.batch_size}, n={n}], got {list(tokens.shape)}"
        )
    positions_list = positions.tolist()
    for i, parent in enumerate(parents.tolist()):
        if not -1 <= parent < i:
            raise ValueError(f"parents[{i}] = {parent}: a parent must come before its child (or be -1)")
        if parent >= 0 and positions_list[i] != positions_list[parent] + 1:
            raise ValueError(
                f"node {i} sits at position {positions_list[i]} but its parent {parent} at "
                f"{positions_list[parent]}: a child is one position after its parent"
            )
    if min(positions_list) < 0 or max(positions_list) >= num_tokens:
        raise ValueError(f"positions must lie in [0, {num_tokens}) (the grid), got {positions_list}")
    low, high = (int(v) for v in torch.stack([tokens.min(), tokens.max()]).tolist())
    if low < 0 or high >= vocab_size:
        raise ValueError(f"tokens must lie in [0, {vocab_size}) (the vocabulary), got min {low} max {high}")
    return positions.to(device=state.written.device, dtype=torch.long) + state.cond_len


def check_step(
    state: DecodeState, tokens: torch.Tensor, positions: torch.Tensor, num_tokens: int, vocab_size: int
) -> torch.Tensor:
    """Validate the arguments of `step` and return the slot indices [n] (int64, on the state's device)."""
    if not isinstance(positions, torch.Tensor) or positions.dim() != 1 or positions.is_floating_point():
        raise ValueError(f"positions must be a 1-D integer tensor (grid indices), got {_describe(positions)}")
    n = positions.shape[0]
    if n == 0:
        raise ValueError("step needs at least one position")
    if not isinstance(tokens, torch.Tensor) or tokens.is_floating_point():
        raise ValueError(f"tokens must be an integer tensor, got {_describe(tokens)}")
    if tuple(tokens.shape) != (state.batch_size, n):
        raise ValueError(
            f"tokens must have shape [batch={state.batch_size}, n={n}] (one column per position), "
            f"got {list(tokens.shape)}"
        )
    cpu = positions.cpu()
    low, high = int(cpu.min()), int(cpu.max())
    if low < 0 or high >= num_tokens:
        raise ValueError(f"positions must lie in [0, {num_tokens}) (the grid), got min {low} max {high}")
    if cpu.unique().numel() != n:
        raise ValueError(f"positions must be distinct within one step, got {cpu.tolist()}")
    low, high = (int(v) for v in torch.stack([tokens.min(), tokens.max()]).tolist())
    if low < 0 or high >= vocab_size:
        raise ValueError(f"tokens must lie in [0, {vocab_size}) (the vocabulary), got min {low} max {high}")
    return (positions.to(device=state.written.device, dtype=torch.long)) + state.cond_len


def _describe(x) -> str:
    if isinstance(x, torch.Tensor):
        return f"tensor of shape {list(x.shape)} and dtype {x.dtype}"
    return type(x).__name__
