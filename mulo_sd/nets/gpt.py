"""LlamaGen-architecture GPT over VQ token grids, with a condition prefix and slot-cache decoding.

Architecture (LlamaGen `autoregressive/models/gpt.py`, Tar AR-DTok `tok/ar_dtok/ar_model.py`): token
embedding, pre-norm blocks (transformer.py: RMSNorm, attention with a fused `wqkv` projection and grouped KV
heads, SwiGLU feed-forward), final RMSNorm, linear head; the config and its presets are in gpt_config.py.
Module and parameter names are the official ones, so both projects' checkpoints load by path with
`mulo_sd.llamagen.gpt_from_official`.

Sequence layout: `cond_len` condition slots, then the h x w grid in raster order. Positions:
- 'rope2d' (LlamaGen t2i): 2-D RoPE on the grid, half of each head's pairs rotated by the row index and half
  by the column index. The condition slots get LlamaGen's all-zero rotation table, which zeroes their queries
  and keys: the prefix reaches the grid only through its values. Kept as is so the checkpoints behave as
  trained.
- 'rope1d': 1-D RoPE over the grid index, same zero prefix.
- 'absolute' (Tar AR-DTok): a learned table `abs_pe` added to every slot's input, prefix included.

Conditions (the prefix): 'words' (testbed: caption word ids -> learned table -> LlamaGen's caption MLP),
't5' (LlamaGen t2i: T5 features -> caption MLP), 'class' (LlamaGen c2i: one class embedding), 'tatok' (Tar
AR-DTok: TA-Tok features -> linear `clip_proj`). The unconditional prefix for classifier-free guidance is
LlamaGen's `uncond_embedding` (words, t5), the extra class row (class) or all-zero features (tatok), as in
the official training code.

Decoding: `start(cond, cfg_scale)` runs the prefix into a fresh `DecodeState`; `step(state, tokens,
positions)` writes tokens at grid positions and returns the guided next-token logits (slot_cache.py);
`step_tree` verifies a draft tree in one call (EAGLE-2, docs/eagle2.md). Training: `forward` teacher-forces
raster order, `forward_in_order` the order a ZipAR-style fill samples (fill_order.py).
"""

from __future__ import annotations

import torch
import torch.nn as nn

from mulo_sd.nets.fill_order import FillOrder
from mulo_sd.nets.gpt_config import GPTConfig
from mulo_sd.nets.io import Pretrained
from mulo_sd.nets.slot_cache import DecodeState, check_row_step, check_step, check_tree, visible_slots
from mulo_sd.nets.transformer import RMSNorm, TransformerBlock, rotary_angles


class MLP(nn.Module):
    """LlamaGen's caption projection: fc1 -> GELU(tanh) -> fc2, no biases."""

    def __init__(self, in_features: int, hidden: int, out_features: int):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden, bias=False)
        self.act = nn.GELU(approximate="tanh")
        self.fc2 = nn.Linear(hidden, out_features, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class CaptionEmbedder(nn.Module):
    """Caption features [B, L, caption_dim] -> prefix [B, L, dim]; `uncond_embedding` is the dropped caption.

    LlamaGen registers `uncond_embedding` as a (fixed, saved) buffer, not a parameter; so does this class.
    """

    def __init__(self, caption_dim: int, dim: int, cond_len: int):
        super().__init__()
        self.cap_proj = MLP(caption_dim, dim, dim)
        self.register_buffer("uncond_embedding", torch.randn(cond_len, caption_dim) / caption_dim**0.5)


class LabelEmbedder(nn.Module):
    """Class ids -> one prefix vector; row `num_classes` (present when dropout is on) is the null class."""

    def __init__(self, num_classes: int, dim: int, dropout_prob: float):
        super().__init__()
        self.embedding_table = nn.Embedding(num_classes + int(dropout_prob > 0), dim)


class GPT(nn.Module, Pretrained):
    kind = "gpt"
    config_class = GPTConfig

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = c = config
        if c.cond_type == "class":
            self.cls_embedding = LabelEmbedder(c.num_classes, c.dim, c.class_dropout_prob)
        elif c.cond_type == "tatok":
            self.clip_proj = nn.Linear(c.caption_dim, c.dim)
        else:
            if c.cond_type == "words":
                self.word_embeddings = nn.Embedding(c.cond_vocab_size, c.caption_dim)
                if c.word_positions:
                    self.word_positions = nn.Parameter(torch.zeros(c.cond_len, c.caption_dim))
            self.cls_embedding = CaptionEmbedder(c.caption_dim, c.dim, c.cond_len)
        self.tok_embeddings = nn.Embedding(c.vocab_size, c.dim)
        self.tok_dropout = nn.Dropout(c.dropout)
        self.layers = nn.ModuleList(TransformerBlock(c) for _ in range(c.n_layer))
        self.norm = RMSNorm(c.dim, c.norm_eps)
        self.output = nn.Linear(c.dim, c.vocab_size, bias=False)
        if c.position == "absolute":
            rows = c.n_positions or c.num_slots
            self.abs_pe = nn.Parameter(torch.randn(1, rows, c.dim) * c.initializer_range)
        self._init_weights()

    def _init_weights(self):
        """LlamaGen's init: N(0, 0.02) linears and embeddings, zero biases, zero output head."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=self.config.initializer_range)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        nn.init.zeros_(self.output.weight)
        if self.config.word_positions:
            nn.init.normal_(self.word_positions, std=self.config.initializer_range)

    @property
    def grid_size(self) -> tuple[int, int]:
        return self.config.grid_size

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    @property
    def num_tokens(self) -> int:
        return self.config.num_tokens

    @property
    def device(self) -> torch.device:
        return self.tok_embeddings.weight.device

    @property
    def has_unconditional(self) -> bool:
        """False only for a class model trained without dropout (no null-class row to guide with)."""
        return self.config.cond_type != "class" or self.config.class_dropout_prob > 0

    # ---- training forward -------------------------------------------------------------------------

    def forward(
        self,
        tokens: torch.Tensor,
        cond: torch.Tensor,
        cond_mask: torch.Tensor | None = None,
        drop: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Teacher forcing: tokens [B, T] (raster order, T <= h*w) -> logits [B, T, V], logits[:, t]
        predicting token t (the first prediction comes from the last condition slot).

        drop: bool [B], rows whose condition is replaced by the unconditional one. None: in training mode
        each row is dropped with probability `class_dropout_prob` (classifier-free guidance training).
        """
        return self._logits(self.features(tokens, cond, cond_mask, drop))

    def features(
        self,
        tokens: torch.Tensor,
        cond: torch.Tensor,
        cond_mask: torch.Tensor | None = None,
        drop: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Teacher forcing like `forward`, returning the final (normed) hidden features [B, T, dim] that the
        output head maps to those logits (what an EAGLE draft head reads and predicts,
        mulo_sd/nets/eagle_head.py).
        """
        c = self.config
        cond, cond_mask = self._check_cond(cond, cond_mask)
        batch = cond.shape[0]
        shape_ok = tokens.dim() == 2 and tokens.shape[0] == batch and 1 <= tokens.shape[1] <= c.num_tokens
        if not shape_ok or tokens.is_floating_point():
            raise ValueError(
                f"tokens must be integer ids of shape [B={batch}, T] with 1 <= T <= {c.num_tokens}, "
                f"got {list(tokens.shape)} {tokens.dtype}"
            )
        _check_range(tokens, c.vocab_size, "tokens")
        if drop is None and self.training and c.class_dropout_prob > 0:
            drop = torch.rand(batch, device=tokens.device) < c.class_dropout_prob
        x = torch.cat([self._embed_condition(cond, drop), self.tok_embeddings(tokens[:, :-1])], dim=1)
        slots = torch.arange(x.shape[1], device=x.device)
        mask = None
        if cond_mask is not None:
            grid_written = torch.ones(batch, tokens.shape[1] - 1, dtype=torch.bool, device=x.device)
            mask = visible_slots(torch.cat([cond_mask, grid_written], dim=1), slots)
        return self._hidden(x, slots, mask)[:, c.cond_len - 1 :]

    def forward_in_order(
        self,
        tokens: torch.Tensor,
        cond: torch.Tensor,
        order: FillOrder,
        cond_mask: torch.Tensor | None = None,
        drop: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """`forward` for full grids [B, h*w] in the order a ZipAR-style fill samples them (fill_order.py):
        logits [B, T, V], logits[:, t] the distribution the fill draws token t from."""
        c = self.config
        cond, cond_mask = self._check_cond(cond, cond_mask)
        batch, slots_in_prefix = cond.shape[0], c.cond_len
        if tuple(tokens.shape) != (batch, c.num_tokens) or tokens.is_floating_point():
            raise ValueError(
                f"tokens must be integer ids [B={batch}, {c.num_tokens}], got {list(tokens.shape)}"
            )
        _check_range(tokens, c.vocab_size, "tokens")
        if drop is None and self.training and c.class_dropout_prob > 0:
            drop = torch.rand(batch, device=tokens.device) < c.class_dropout_prob
        order = order.to(tokens.device)
        fed = self.tok_embeddings(tokens[:, order.inputs])
        x = torch.cat([self._embed_condition(cond, drop), fed], dim=1)
        slots = torch.cat([torch.arange(slots_in_prefix, device=x.device), slots_in_prefix + order.positions])
        if cond_mask is None:
            cond_mask = torch.ones(batch, slots_in_prefix, dtype=torch.bool, device=x.device)
        hidden = self._hidden(x, slots, order.attention_mask(cond_mask))
        first = order.predictors.new_tensor([slots_in_prefix - 1])
        picks = torch.cat([first, slots_in_prefix + order.predictors])
        return self._logits(hidden[:, picks])

    # ---- slot-cache decoding ----------------------------------------------------------------------

    @torch.inference_mode()
    def start(
        self, cond: torch.Tensor, cfg_scale: float = 1.0, cond_mask: torch.Tensor | None = None
    ) -> DecodeState:
        """Run the condition prefix. cond: class ids [B] ('class'), word ids [B, L] ('words') or features
        [B, L, caption_dim] ('t5', 'tatok'); cond_mask: bool [B, L], False on padding (LlamaGen pads on the
        left, so the last slot, which predicts grid position 0, is a real one). cfg_scale != 1 doubles the
        rows internally (conditional, then unconditional with the same mask)."""
        c = self.config
        cond, cond_mask = self._check_cond(cond, cond_mask)
        batch = cond.shape[0]
        drop = None
        if cfg_scale != 1.0:
            if not self.has_unconditional:
                raise ValueError("cfg_scale != 1 needs an unconditional class row (class_dropout_prob > 0)")
            cond = torch.cat([cond, cond])
            cond_mask = None if cond_mask is None else torch.cat([cond_mask, cond_mask])
            drop = torch.arange(2 * batch, device=cond.device) >= batch
        prefix = self._embed_condition(cond, drop)
        state = DecodeState.allocate(
            c.n_layer, prefix.shape[0], c.kv_heads, c.num_slots, c.head_dim, c.cond_len, cfg_scale,
            prefix.dtype, prefix.device,
        )  # fmt: skip
        state.written[:, : c.cond_len] = True if cond_mask is None else cond_mask
        slots = torch.arange(c.cond_len, device=prefix.device)
        hidden = self._hidden(prefix, slots, state.attention_mask(slots), state)
        state.first_logits = state.guide(self._logits(hidden[:, -1]))
        state.first_hidden = hidden[:, -1]
        return state

    def _config_of(self, state: DecodeState) -> GPTConfig:
        """The model's config, once `state` is checked to be one of this model's (made by its `start`)."""
        c = self.config
        if state.cond_len != c.cond_len or state.num_slots != c.num_slots or len(state.keys) != c.n_layer:
            raise ValueError("this DecodeState was not made by this model's `start`")
        return c

    @torch.inference_mode()
    def step(self, state: DecodeState, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Write tokens [B, n] at grid positions [n] and return guided logits [B, n, V]; logits[:, i] is the
        next-token distribution for grid position positions[i] + 1."""
        c = self._config_of(state)
        slots = check_step(state, tokens, positions, c.num_tokens, c.vocab_size)
        tokens = tokens.to(device=slots.device, dtype=torch.long)
        if state.guided:
            tokens = torch.cat([tokens, tokens])
        state.mark_written(slots)
        hidden = self._hidden(self.tok_embeddings(tokens), slots, state.attention_mask(slots), state)
        return state.guide(self._logits(hidden))

    @torch.inference_mode()
    def step_rows(self, state: DecodeState, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """`step` with positions of its own for every row: tokens, positions [B, n]; an entry at PADDING
        (slot_cache.py) feeds nothing a real query sees and its logits are meaningless. Each row's real
        entries get the logits `step` would give that row alone. Batched decoding (methods/lockstep.py)."""
        c = self._config_of(state)
        slots = check_row_step(state, tokens, positions, c.num_tokens, c.vocab_size)
        tokens = tokens.to(device=slots.device, dtype=torch.long)
        if state.guided:
            tokens, slots = torch.cat([tokens, tokens]), torch.cat([slots, slots])
        state.written.scatter_(1, slots, True)
        state.written[:, state.num_slots :] = False  # the padding slot is never shown to a query
        hidden = self._hidden(self.tok_embeddings(tokens), slots, state.attention_mask(slots), state)
        return state.guide(self._logits(hidden))

    @torch.inference_mode()
    def step_tree(
        self, state: DecodeState, tokens: torch.Tensor, positions: torch.Tensor, parents: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed a token tree in one call: node i holds tokens[:, i] at grid position positions[i], its parent
        is node parents[i] (-1: a root, whose context is the written grid before its position). The nodes go
        to the state's tree slots, not to the grid (slot_cache.py: add_tree_slots, commit_tree). Returns the
        guided logits [B, n, V] (the next-token distribution after each node's path) and the final hidden
        features [B', n, dim] of every internal row (conditional rows first under guidance)."""
        c = self._config_of(state)
        slots = check_tree(state, tokens, positions, parents, c.num_tokens, c.vocab_size)
        tokens = tokens.to(device=slots.device, dtype=torch.long)
        if state.guided:
            tokens = torch.cat([tokens, tokens])
        mask = state.tree_attention_mask(slots, parents.to(slots.device))
        scratch = state.num_slots + torch.arange(slots.shape[0], device=slots.device)
        hidden = self._hidden(self.tok_embeddings(tokens), slots, mask, state, write_slots=scratch)
        return state.guide(self._logits(hidden)), hidden

    # ---- shared internals -------------------------------------------------------------------------

    def _hidden(self, x, slots, mask, state: DecodeState | None = None, write_slots=None) -> torch.Tensor:
        """Positions from `slots`; K/V go to the cache at `write_slots` (default `slots`)."""
        x = self._add_positions(self.tok_dropout(x), slots)
        rotation = self._rotation(slots)
        write_slots = slots if write_slots is None else write_slots
        for i, layer in enumerate(self.layers):
            cache = None if state is None else (state.keys[i], state.values[i])
            x = layer(x, rotation, mask, cache, write_slots)
        return self.norm(x)

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.output(hidden)
        return logits.to(torch.promote_types(logits.dtype, torch.float32))

    def _add_positions(self, x: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        if self.config.position != "absolute":
            return x
        table = self.abs_pe[0]
        # Tar's table stops one row short: the last grid token is never an input in training. Fed anyway,
        # it gets no position; nothing can attend to its slot and its prediction points past the grid.
        inside = (slots < table.shape[0]).unsqueeze(-1)
        return x + table[slots.clamp(max=table.shape[0] - 1)] * inside

    def _rotation(self, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """cos, sin [n, head_dim/2] for the slots, computed in float32 like LlamaGen's tables."""
        c = self.config
        if c.position == "absolute":
            return None
        grid = slots - c.cond_len
        angles = rotary_angles(c.position, c.head_dim, c.rope_base, c.grid_size[1], grid)
        in_prefix = (grid < 0)[..., None]
        if c.prefix_rotation == "identity":  # cos 1, sin 0: the prefix's queries and keys pass unrotated
            return angles.cos().masked_fill(in_prefix, 1.0), angles.sin().masked_fill(in_prefix, 0.0)
        # LlamaGen's zero rows: the prefix's queries and keys become 0
        return angles.cos().masked_fill(in_prefix, 0.0), angles.sin().masked_fill(in_prefix, 0.0)

    def _embed_condition(self, cond: torch.Tensor, drop: torch.Tensor | None) -> torch.Tensor:
        """cond (checked) -> prefix [B, cond_len, dim]; rows with drop=True get the unconditional prefix."""
        c = self.config
        if c.cond_type == "class":
            if drop is not None:
                if not self.has_unconditional:
                    raise ValueError("dropping the class needs class_dropout_prob > 0 (a null-class row)")
                cond = torch.where(drop, c.num_classes, cond)
            return self.cls_embedding.embedding_table(cond).unsqueeze(1)
        dtype = self.tok_embeddings.weight.dtype
        if c.cond_type == "tatok":
            features = cond.to(dtype)
            if drop is not None:
                features = features.masked_fill(drop[:, None, None], 0.0)  # Tar's null condition: zeros
            return self.clip_proj(features)
        if c.cond_type == "words":
            features = self.word_embeddings(cond)
            if c.word_positions:
                features = features + self.word_positions
        else:
            features = cond.to(dtype)
        if drop is not None:
            uncond = self.cls_embedding.uncond_embedding.to(features.dtype)
            features = torch.where(drop[:, None, None], uncond, features)
        return self.cls_embedding.cap_proj(features)

    def _check_cond(self, cond, cond_mask):
        c = self.config
        if not isinstance(cond, torch.Tensor):
            raise ValueError(f"cond must be a tensor, got {type(cond).__name__}")
        expected = {
            "class": ("class ids [B]", 1),
            "words": (f"caption word ids [B, {c.cond_len}]", 2),
            "t5": (f"T5 features [B, {c.cond_len}, {c.caption_dim}]", 3),
            "tatok": (f"TA-Tok features [B, {c.cond_len}, {c.caption_dim}]", 3),
        }[c.cond_type]
        shape_ok = cond.dim() == expected[1] and cond.shape[0] >= 1
        if cond.dim() >= 2:
            shape_ok = shape_ok and cond.shape[1] == c.cond_len
        if cond.dim() == 3:
            shape_ok = shape_ok and cond.shape[2] == c.caption_dim
        integer = c.cond_type in ("class", "words")
        if not shape_ok or cond.is_floating_point() == integer:
            raise ValueError(
                f"cond for cond_type '{c.cond_type}' must be {expected[0]} "
                f"({'integer' if integer else 'floating'}), got shape {list(cond.shape)} dtype {cond.dtype}"
            )
        if integer:
            _check_range(cond, c.num_classes if c.cond_type == "class" else c.cond_vocab_size, "cond ids")
        if cond_mask is None:
            return cond, None
        if c.cond_type == "class":
            raise ValueError("cond_type 'class' has a single condition slot and takes no cond_mask")
        if tuple(cond_mask.shape) != (cond.shape[0], c.cond_len):
            raise ValueError(
                f"cond_mask must have shape [{cond.shape[0]}, {c.cond_len}], got {list(cond_mask.shape)}"
            )
        return cond, cond_mask.to(device=cond.device, dtype=torch.bool)


def _check_range(ids: torch.Tensor, size: int, name: str) -> None:
    low, high = (int(v) for v in torch.stack([ids.min(), ids.max()]).tolist())
    if low < 0 or high >= size:
        raise ValueError(f"{name} must lie in [0, {size}), got min {low} max {high}")
