"""Decoding steps of a `GPT` run through `torch.compile`d graphs (the `compile` option of `decode`).

LlamaGen's sampler compiles its one-token decode step over a static KV cache with `mode="reduce-overhead",
fullgraph=True`; this does the same over the slot cache (slot_cache.py), whose K/V tensors already have a
static shape. `compiled(model, device_type)` wraps a GPT: every attribute passes through, and
- `step` / `step_rows` validate and mark the written slots eagerly (as GPT's own do), then run
  `cache_forward` (embeddings -> blocks writing K/V into the state's tensors in place -> norm -> logits)
  compiled with fullgraph=True (no graph breaks) and dynamic=False. To keep the shapes to a few, the fed
  entries n are padded up to the next power of two (`bucket`) with entries at the padding slot of
  `step_rows` (the state's first tree slot: nothing a real query sees), so each (kind of step, bucket,
  batch, model shape) compiles once and the real entries' logits are those of the eager step. A `step`
  whose padding would compute more than SPLIT_WASTE unused entries runs instead as power-of-two chunks in
  slot order (`chunks`): MuLo-SD's second verification feeds 128 drafts plus one outdated slot, which
  padding would run as 256. Chunking is exact because a query sees only slots at or below its own, so every
  query of a chunk finds the lower chunks' K/V already written, as in one call;
- `start` runs eagerly (once per decode) and gives the state that padding slot (`add_tree_slots(1)`); with
  `every_width` it also compiles, the first time it meets a state shape (model, batch, guidance), the step
  graph of every bucket width up to the grid, so that no later decode compiles one inside a timed loop
  (an island step of a width no warm-up decode fed). That costs a second or more per graph on a CPU, so it is
  the evaluation harness's choice for timed compiled runs, not the default;
- `step_tree` (EAGLE-2's verification) stays eager: its node count and tree slots vary per call, and its
  scratch slots are the tree slots themselves, so padding entries would need slots of their own.

On CUDA the graphs are CUDA graphs (mode="reduce-overhead"): the state's cache tensors are marked as static
inputs so the in-place K/V writes do not make inductor skip them (a new state, e.g. a fork or the next decode,
re-records instead of recompiling: guard=False), and the logits are cloned out of the graph's output buffer,
which the next replay overwrites. Inductor compiles for the CPU otherwise. The wrapper holds no per-decode
state: everything that changes lives in the DecodeState, as with the eager model.

Tokens equal the eager decode's up to float rounding: the compiled kernels and the padded matrix shapes may
round differently in the last bits (tests/decoding/test_compiled.py checks that the sampled tokens agree).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import torch.nn.functional as F

from mulo_sd.nets.gpt import GPT
from mulo_sd.nets.slot_cache import DecodeState, check_row_step, check_step

# graphs per compiled function: (step, step_rows) x buckets x batch sizes x model shapes, target and drafter
# together (dynamo counts them per function, and the default of 8 would quietly fall back to eager)
RECOMPILE_LIMIT = 256

# (model id, batch, guided, slots, cuda) whose every bucket width `CompiledGPT(every_width=True)` compiled
# already in this process (dynamo keeps the graphs; this only saves feeding them again)
COMPILED_SHAPES: set[tuple] = set()


class KVCache(NamedTuple):
    """The part of a DecodeState that `GPT._hidden` reads: per-layer K and V tensors."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]


def cache_forward(model: GPT, tokens, slots, mask, keys, values) -> torch.Tensor:
    """Internal-row tokens [B', m] at `slots` ([m], or [B', m] per row) under `mask` -> logits [B', m, V];
    the K/V of the tokens are written into `keys` / `values` at their slots, in place."""
    hidden = model._hidden(model.tok_embeddings(tokens), slots, mask, KVCache(keys, values))
    return model._logits(hidden)


def bucket(n: int) -> int:
    """The padded width of a step feeding n entries: the next power of two."""
    return 1 << (n - 1).bit_length()


# A `step` whose padding to `bucket` would compute more than this many unused entries is fed in chunks
# instead; one more compiled call costs about as much as 10-20 entries of the testbed's target on a CPU
SPLIT_WASTE = 32


def chunks(n: int) -> list[int]:
    """The entry counts a compiled `step` of n entries runs as, in slot order: n itself (padded to its bucket)
    unless that pads more than SPLIT_WASTE entries; then the largest power of two below n, and the rest
    likewise (129 -> [128, 1])."""
    sizes = []
    while bucket(n) - n > SPLIT_WASTE:
        sizes.append(bucket(n) // 2)
        n -= sizes[-1]
    return [*sizes, n]


def compiled(model: GPT, device_type: str, every_width: bool = False) -> CompiledGPT:
    """`model` with its decoding steps compiled for `device_type` ('cpu' or 'cuda'); `every_width`: every
    bucket width compiled when `start` first meets a state shape (module docstring)."""
    if not isinstance(model, GPT):
        raise ValueError(f"compile supports GPT models only, got {type(model).__name__}")
    if model.training:
        raise ValueError("compile decodes with a model in eval mode (dropout off); call model.eval() first")
    return CompiledGPT(model, device_type, every_width)


@functools.cache
def compiled_forward(cuda: bool):
    """`cache_forward` through torch.compile, made once per process and mode: every wrapper shares it (and
    dynamo's graphs for it, keyed by model and shapes)."""
    limit = torch._dynamo.config.recompile_limit
    torch._dynamo.config.recompile_limit = max(limit, RECOMPILE_LIMIT)
    mode = "reduce-overhead" if cuda else None
    return torch.compile(cache_forward, fullgraph=True, dynamic=False, mode=mode)


class CompiledGPT:
    """A GPT whose `step` and `step_rows` run compiled graphs; every other attribute is the GPT's."""

    def __init__(self, model: GPT, device_type: str, every_width: bool = False):
        self._wrapped = model
        self._cuda = device_type == "cuda"
        self._every_width = every_width
        self._forward = compiled_forward(self._cuda)

    def __getattr__(self, name: str):
        return getattr(self._wrapped, name)

    @torch.inference_mode()
    def start(
        self, cond: torch.Tensor, cfg_scale: float = 1.0, cond_mask: torch.Tensor | None = None
    ) -> DecodeState:
        """GPT.start, plus the padding slot that the compiled steps pad with."""
        state = self._wrapped.start(cond, cfg_scale, cond_mask=cond_mask)
        state.add_tree_slots(1)
        if self._every_width:
            self._compile_every_width(cond, cfg_scale, cond_mask, state)
        return state

    def _compile_every_width(self, cond, cfg_scale: float, cond_mask, state: DecodeState) -> None:
        """Run `step` (and, for a batch of several rows, `step_rows`) once at every bucket width on a scratch
        state shaped like `state`, once per process and shape (`COMPILED_SHAPES`)."""
        shape = (id(self._wrapped), state.batch_size, state.guided, state.num_slots, self._cuda)
        if shape in COMPILED_SHAPES:
            return
        scratch = self._wrapped.start(cond, cfg_scale, cond_mask=cond_mask)
        scratch.add_tree_slots(1)
        device, batch, width = state.written.device, state.batch_size, 1
        while True:
            n = min(width, self._wrapped.num_tokens)
            tokens = torch.zeros(batch, n, dtype=torch.long, device=device)
            positions = torch.arange(n, device=device)
            self.step(scratch, tokens, positions)
            if batch > 1:
                self.step_rows(scratch, tokens, positions.expand(batch, n))
            if n == self._wrapped.num_tokens:
                break
            width *= 2
        COMPILED_SHAPES.add(shape)

    @torch.inference_mode()
    def step(self, state: DecodeState, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """GPT.step: tokens [B, n] at grid positions [n] -> guided logits [B, n, V]."""
        c = self._wrapped._config_of(state)
        slots = check_step(state, tokens, positions, c.num_tokens, c.vocab_size)
        state.mark_written(slots)
        sizes = chunks(tokens.shape[1])
        if len(sizes) == 1:
            return self._run(state, tokens, slots)
        order = slots.argsort()
        parts = zip(tokens.to(slots.device)[:, order].split(sizes, 1), slots[order].split(sizes), strict=True)
        logits = torch.cat([self._run(state, *part) for part in parts], 1)
        return logits[:, order.argsort()]

    @torch.inference_mode()
    def step_rows(self, state: DecodeState, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """GPT.step_rows: tokens, positions [B, n] (PADDING where a row feeds nothing) -> logits [B, n, V]."""
        c = self._wrapped._config_of(state)
        slots = check_row_step(state, tokens, positions, c.num_tokens, c.vocab_size)
        if state.guided:
            slots = torch.cat([slots, slots])
        state.written.scatter_(1, slots, True)
        state.written[:, state.num_slots :] = False  # the padding slot is never shown to a query
        return self._run(state, tokens, slots)

    def _run(self, state: DecodeState, tokens: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """Pad the n entries to `bucket(n)` at the padding slot, run the graph, keep the real entries."""
        n = tokens.shape[1]
        width = bucket(n)
        if width > n and state.tree_slots < 1:
            raise ValueError("a compiled step pads into a tree slot: start the state with the compiled model")
        tokens = F.pad(tokens.to(device=slots.device, dtype=torch.long), (0, width - n))
        slots = F.pad(slots, (0, width - n), value=state.num_slots)
        if state.guided:
            tokens = torch.cat([tokens, tokens])
        mask = state.attention_mask(slots)
        if self._cuda:
            for cache in (*state.keys, *state.values):
                torch._dynamo.mark_static_address(cache, guard=False)
            torch.compiler.cudagraph_mark_step_begin()
            logits = self._forward(self._wrapped, tokens, slots, mask, state.keys, state.values).clone()
        else:
            logits = self._forward(self._wrapped, tokens, slots, mask, state.keys, state.values)
        return state.guide(logits[:, :n])
