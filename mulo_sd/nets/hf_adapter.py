"""Slot-cache decoding (slot_cache.py) for a `transformers` causal LM that generates image tokens.

Image token i is the LM's token `image_token_offset + i`; the condition is a prefix of LM token ids or of
input embeddings. The K/V live in the state's tensors; each call lends them to a `StaticCache` and passes
- `cache_position` = the slot indices: HF writes the new K/V there with `index_copy_`, so any order and
  overwrites work;
- `position_ids` = the same indices (the RoPE position of a token is its slot, padding included);
- a 4-D boolean `attention_mask` [B', 1, n, S], True = attend (which written slots each query sees).
The adapter keeps one StaticCache across steps: `start` builds it, `step` reuses it, re-pointing its layers
only when a state with other K/V tensors comes in (a fork, a selection, another decode).

Why boolean: transformers (4.57) hands a 4-D mask to the attention function untouched, and SDPA reads a bool
mask as "attend here" whatever the model dtype. An additive float mask (0 / -inf) gives the same logits
under SDPA (checked), but the eager attention adds whatever mask it is given, so True would become +1: the
adapter therefore insists on `attn_implementation="sdpa"`, where the boolean mask is exact.
"""

from __future__ import annotations

import torch
from transformers import StaticCache
from transformers.cache_utils import StaticLayer

from mulo_sd.nets.slot_cache import DecodeState, check_step


class HFCausalLM:
    """Same decoding interface as `GPT`: `start`, `step`, and the state's `fork` / `select` / `clone`."""

    def __init__(
        self,
        model,
        grid_size: int | tuple[int, int],
        uncond: torch.Tensor | None = None,
        uncond_mask: torch.Tensor | None = None,
        image_token_offset: int = 0,
        vocab_size: int | None = None,
    ):
        """model: a causal LM in eval mode loaded with attn_implementation="sdpa". uncond: the unconditional
        prefix for classifier-free guidance, ids [L] or embeddings [L, hidden] (same kind and length as the
        conditions it will guide), with an optional bool uncond_mask [L]. vocab_size: image tokens (default:
        the rest of the LM vocabulary after the offset)."""
        implementation = getattr(model.config, "_attn_implementation", None)
        if implementation != "sdpa":
            raise ValueError(
                "HFCausalLM needs a model loaded with attn_implementation='sdpa' (it passes a boolean 4-D "
                f"mask), got {implementation}"
            )
        self.model = model
        self.grid_size = (grid_size, grid_size) if isinstance(grid_size, int) else tuple(grid_size)
        self.image_token_offset = image_token_offset
        self.vocab_size = vocab_size or model.config.vocab_size - image_token_offset
        if self.vocab_size < 1 or image_token_offset + self.vocab_size > model.config.vocab_size:
            raise ValueError(
                f"image tokens [{image_token_offset}, {image_token_offset + self.vocab_size}) exceed the LM "
                f"vocabulary of {model.config.vocab_size}"
            )
        self.uncond, self.uncond_mask = uncond, uncond_mask
        self._cache: StaticCache | None = None  # lent to the last state stepped (_lend)

    @property
    def num_tokens(self) -> int:
        return self.grid_size[0] * self.grid_size[1]

    @property
    def device(self) -> torch.device:
        return self.model.device

    @torch.inference_mode()
    def start(
        self, cond: torch.Tensor, cfg_scale: float = 1.0, cond_mask: torch.Tensor | None = None
    ) -> DecodeState:
        """cond: prefix ids [B, L] or embeddings [B, L, hidden]; cond_mask: bool [B, L], False on padding."""
        embeds = cond.is_floating_point()
        hidden = self.model.config.hidden_size
        if cond.dim() != (3 if embeds else 2) or (embeds and cond.shape[-1] != hidden):
            raise ValueError(
                f"cond must be prefix ids [B, L] or embeddings [B, L, {hidden}], got {list(cond.shape)}"
            )
        batch, cond_len = cond.shape[:2]
        device = self.model.device
        cond = cond.to(device)
        mask = torch.ones(batch, cond_len, dtype=torch.bool, device=device)
        if cond_mask is not None:
            if tuple(cond_mask.shape) != (batch, cond_len):
                raise ValueError(
                    f"cond_mask must have shape [{batch}, {cond_len}], got {list(cond_mask.shape)}"
                )
            mask = cond_mask.to(device=device, dtype=torch.bool)
        if cfg_scale != 1.0:
            uncond, uncond_mask = self._unconditional(cond)
            cond, mask = torch.cat([cond, uncond]), torch.cat([mask, uncond_mask])
        rows, num_slots = cond.shape[0], cond_len + self.num_tokens
        state = DecodeState(
            keys=[],
            values=[],
            written=torch.zeros(rows, num_slots, dtype=torch.bool, device=device),
            cfg_scale=cfg_scale,
            cond_len=cond_len,
            first_logits=torch.empty(0),
        )
        state.written[:, :cond_len] = mask
        cache = StaticCache(config=self.model.config, max_cache_len=num_slots)
        _check_layers(cache)
        slots = torch.arange(cond_len, device=device)
        prefix = {"inputs_embeds": cond.to(self.model.dtype)} if embeds else {"input_ids": cond.long()}
        logits = self._forward(state, cache, slots, **prefix)
        state.keys = [layer.keys for layer in cache.layers]  # allocated by HF on first use
        state.values = [layer.values for layer in cache.layers]
        self._cache = cache
        state.first_logits = state.guide(logits[:, -1])
        return state

    @torch.inference_mode()
    def step(self, state: DecodeState, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Write tokens [B, n] at grid positions [n]; guided logits [B, n, V] for positions + 1."""
        slots = check_step(state, tokens, positions, self.num_tokens, self.vocab_size)
        ids = tokens.to(device=slots.device, dtype=torch.long) + self.image_token_offset
        if state.guided:
            ids = torch.cat([ids, ids])
        state.mark_written(slots)
        return state.guide(self._forward(state, self._lend(state), slots, input_ids=ids))

    def _forward(self, state: DecodeState, cache: StaticCache, slots: torch.Tensor, **inputs) -> torch.Tensor:
        rows = state.written.shape[0]
        out = self.model(
            **inputs,
            past_key_values=cache,
            cache_position=slots,
            position_ids=slots.expand(rows, -1),
            attention_mask=state.attention_mask(slots),
            use_cache=True,
        )
        logits = out.logits[..., self.image_token_offset : self.image_token_offset + self.vocab_size]
        return logits.to(torch.promote_types(logits.dtype, torch.float32))

    def _lend(self, state: DecodeState) -> StaticCache:
        """The adapter's StaticCache over the state's own K/V tensors: HF's in-place writes land in the state.

        Re-pointing a layer is a few attribute writes; a new StaticCache per step cost ~50 us at 28 layers."""
        cache = self._cache
        if cache is None:
            cache = self._cache = StaticCache(config=self.model.config, max_cache_len=state.keys[0].shape[2])
            _check_layers(cache)
        for layer, keys, values in zip(cache.layers, state.keys, state.values, strict=True):
            if layer.is_initialized and layer.keys is keys and layer.values is values:
                continue
            layer.max_batch_size, layer.num_heads, layer.max_cache_len, layer.head_dim = keys.shape
            layer.dtype, layer.device = keys.dtype, keys.device
            layer.keys, layer.values = keys, values
            layer.is_initialized = True
        return cache

    def _unconditional(self, cond: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The unconditional prefix and mask, repeated over the batch of `cond`."""
        batch, cond_len = cond.shape[:2]
        if self.uncond is None:
            raise ValueError("cfg_scale != 1 needs the unconditional prefix: HFCausalLM(..., uncond=...)")
        uncond = self.uncond.to(cond.device)
        if uncond.shape != cond.shape[1:] or uncond.is_floating_point() != cond.is_floating_point():
            raise ValueError(
                f"uncond must match one condition row (shape {list(cond.shape[1:])}, "
                f"{'embeddings' if cond.is_floating_point() else 'ids'}), "
                f"got {list(uncond.shape)} {uncond.dtype}"
            )
        mask = torch.ones(cond_len, dtype=torch.bool, device=cond.device)
        if self.uncond_mask is not None:
            mask = self.uncond_mask.to(device=cond.device, dtype=torch.bool)
        return uncond.expand(batch, *uncond.shape), mask.expand(batch, cond_len)


def _check_layers(cache: StaticCache) -> None:
    # sliding-window layers keep a rolling buffer, not one slot per position
    if any(type(layer) is not StaticLayer for layer in cache.layers):
        raise ValueError("HFCausalLM supports full-attention models only (no sliding-window layers)")
