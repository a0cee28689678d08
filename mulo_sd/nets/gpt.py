"""LlamaGen-architecture GPT over VQ token grids, with a condition prefix and slot-cache decoding.

Architecture (LlamaGen `autoregressive/models/gpt.py`, Tar AR-DTok `tok/ar_dtok/ar_model.py`): token
embedding, pre-norm blocks (RMSNorm, attention with a fused `wqkv` projection and grouped KV heads, SwiGLU
feed-forward), final RMSNorm, linear head. Module and parameter names are the official ones, so both
projects' checkpoints load by path with `GPT.from_official`.

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
`step_tree` verifies a draft tree in one call (EAGLE-2, docs/eagle2.md).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from mulo_sd.llamagen.official import OfficialCheckpoint, read_official
from mulo_sd.llamagen.official_configs import check_gpt_config, gpt_fields
from mulo_sd.nets.io import Pretrained
from mulo_sd.nets.slot_cache import DecodeState, check_step, check_tree, visible_slots

CONDITIONS = ("words", "t5", "class", "tatok")
POSITIONS = ("rope2d", "rope1d", "absolute")
# How rotary positions treat the condition prefix. 'zero' is LlamaGen's: the prefix's queries and keys are
# multiplied by zero, so every grid query scores every prefix slot alike and reads a plain average of the
# prefix values (fine for contextual T5 features). 'identity' leaves them unrotated, so attention can pick
# words by content, which word-embedding captions need to bind colours to shapes.
PREFIX_ROTATIONS = ("zero", "identity")
OFFICIAL_GPT_SOURCES = (
    "download the official checkpoint and pass its local path (LlamaGen t2i: t2i_XL_stage1_256.pt / "
    "t2i_XL_stage2_512.pt from huggingface.co/peizesun/llamagen_t2i; Tar AR-DTok: "
    "ar_dtok_lp_{256,512,1024}px.pth from huggingface.co/csuhan/TA-Tok)"
)


class BlockDims:
    """Sizes derived from a LlamaGen-style config's fields (dim, n_head, n_kv_head, grid_size,
    ffn_dim_multiplier, multiple_of): shared by the GPT and the EAGLE draft head, whose blocks are alike."""

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_head

    @property
    def kv_heads(self) -> int:
        return self.n_kv_head or self.n_head

    @property
    def num_tokens(self) -> int:
        return self.grid_size[0] * self.grid_size[1]

    @property
    def ffn_hidden(self) -> int:
        hidden = int(2 * 4 * self.dim / 3)
        if self.ffn_dim_multiplier is not None:
            hidden = int(self.ffn_dim_multiplier * hidden)
        return -(-hidden // self.multiple_of) * self.multiple_of


@dataclass
class GPTConfig(BlockDims):
    vocab_size: int  # image tokens (the VQ codebook size)
    grid_size: tuple[int, int]  # (h, w) tokens; an int n means (n, n)
    dim: int
    n_layer: int
    n_head: int
    cond_type: str  # one of CONDITIONS
    cond_len: int  # condition slots before the grid (LlamaGen's cls_token_num)
    n_kv_head: int | None = None  # None: n_head
    multiple_of: int = 256  # SwiGLU hidden size is rounded up to a multiple of this
    ffn_dim_multiplier: float | None = None
    norm_eps: float = 1e-5
    rope_base: float = 10000.0
    position: str = "rope2d"  # one of POSITIONS
    n_positions: int | None = None  # rows of the 'absolute' table; None: one per slot
    prefix_rotation: str = "zero"  # one of PREFIX_ROTATIONS (rotary positions only)
    word_positions: bool = False  # 'words': add a learned position per caption word (word order matters)
    cond_vocab_size: int = 0  # 'words': caption vocabulary size
    caption_dim: int = 2048  # 'words', 't5', 'tatok': width of the features entering the projection
    num_classes: int = 1000  # 'class'
    class_dropout_prob: float = 0.1  # training-time condition dropout, for classifier-free guidance
    dropout: float = 0.0  # embedding, attention-output and feed-forward dropout (LlamaGen's dropout_p)
    initializer_range: float = 0.02

    def __post_init__(self):
        size = self.grid_size
        self.grid_size = (size, size) if isinstance(size, int) else tuple(int(s) for s in size)
        if len(self.grid_size) != 2 or min(self.grid_size) < 1:
            raise ValueError(f"grid_size must be a positive int or (h, w), got {size}")
        if self.cond_type not in CONDITIONS:
            raise ValueError(f"cond_type must be one of {CONDITIONS}, got '{self.cond_type}'")
        if self.position not in POSITIONS:
            raise ValueError(f"position must be one of {POSITIONS}, got '{self.position}'")
        if self.prefix_rotation not in PREFIX_ROTATIONS:
            rotation = self.prefix_rotation
            raise ValueError(f"prefix_rotation must be one of {PREFIX_ROTATIONS}, got '{rotation}'")
        if self.word_positions and self.cond_type != "words":
            raise ValueError(f"word_positions needs cond_type 'words', got '{self.cond_type}'")
        if self.dim % self.n_head:
            raise ValueError(f"dim {self.dim} is not divisible by n_head {self.n_head}")
        if self.n_head % self.kv_heads:
            raise ValueError(f"n_head {self.n_head} is not a multiple of n_kv_head {self.kv_heads}")
        rotated_pairs = {"rope2d": 4, "rope1d": 2}.get(self.position, 1)
        if self.head_dim % rotated_pairs:
            raise ValueError(
                f"'{self.position}' needs head_dim divisible by {rotated_pairs}, got {self.head_dim}"
            )
        if self.cond_len < 1:
            raise ValueError(f"cond_len must be >= 1, got {self.cond_len}")
        if self.cond_type == "class" and self.cond_len != 1:
            raise ValueError(f"cond_type 'class' uses one condition slot, got cond_len {self.cond_len}")
        if self.cond_type == "words" and self.cond_vocab_size < 1:
            raise ValueError("cond_type 'words' needs cond_vocab_size >= 1")
        # Tar's table has no row for the last grid token, which is never an input (see GPT._add_positions)
        if self.n_positions is not None and self.n_positions < self.num_slots - 1:
            raise ValueError(f"n_positions {self.n_positions} < {self.num_slots - 1} (cond_len + h*w - 1)")

    @property
    def num_slots(self) -> int:
        return self.cond_len + self.num_tokens

    @classmethod
    def llamagen_t2i_xl(cls, resolution: int = 256, **overrides) -> GPTConfig:
        """LlamaGen GPT-XL text-to-image: `t2i_XL_stage1_256.pt` (256) or `t2i_XL_stage2_512.pt` (512).

        120 FLAN-T5-XL feature slots (2048-d), VQ ds16 tokenizer with 16384 codes.
        """
        config = cls(
            vocab_size=16384,
            grid_size=_grid_for(resolution),
            dim=1280,
            n_layer=36,
            n_head=20,
            cond_type="t5",
            cond_len=120,
            caption_dim=2048,
            position="rope2d",
        )
        return dataclasses.replace(config, **overrides)

    @classmethod
    def tar_ar_dtok(
        cls, resolution: int, cond_len: int = 729, trained_cond_len: int = 729, **overrides
    ) -> GPTConfig:
        """Tar AR-DTok 'llama-abs-LP' (`ar_dtok_lp_{256,512,1024}px.pth`): 30 layers, 20 heads, dim 1280.

        The prefix is TA-Tok features (1152-d, the SigLIP2 width): 729, 169 or 81 slots for Tar's scales
        0, 1, 2. Tar's position table has max_seq_len + cls_token_num - 1 rows, where cls_token_num is the
        value the checkpoint was built with; `trained_cond_len` assumes Tar's largest scale (729). If that
        is wrong, `from_official` names the real `abs_pe` shape; pass `n_positions` to match it.
        """
        grid = _grid_for(resolution)
        config = cls(
            vocab_size=16384,
            grid_size=grid,
            dim=1280,
            n_layer=30,
            n_head=20,
            cond_type="tatok",
            cond_len=cond_len,
            caption_dim=1152,
            position="absolute",
            n_positions=grid * grid + trained_cond_len - 1,
        )
        return dataclasses.replace(config, **overrides)


def _grid_for(resolution: int) -> int:
    if resolution % 16:
        raise ValueError(f"resolution {resolution} is not a multiple of the VQ downsampling factor 16")
    return resolution // 16


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x  # normalise in >= float32
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.type_as(x) * self.weight


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x)."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.w1 = nn.Linear(config.dim, config.ffn_hidden, bias=False)
        self.w3 = nn.Linear(config.dim, config.ffn_hidden, bias=False)
        self.w2 = nn.Linear(config.ffn_hidden, config.dim, bias=False)
        self.ffn_dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ffn_dropout(self.w2(F.silu(self.w1(x)) * self.w3(x)))


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the interleaved pairs (x[2i], x[2i+1]) of x [B, n, heads, head_dim]; cos, sin: [n, hd/2]."""
    dtype = torch.promote_types(x.dtype, torch.float32)
    real, imag = x.to(dtype).unflatten(-1, (-1, 2)).unbind(-1)
    cos, sin = cos.to(dtype)[None, :, None], sin.to(dtype)[None, :, None]
    rotated = torch.stack([real * cos - imag * sin, imag * cos + real * sin], dim=-1)
    return rotated.flatten(-2).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.n_head, self.n_kv_head, self.head_dim = config.n_head, config.kv_heads, config.head_dim
        self.wqkv = nn.Linear(config.dim, (config.n_head + 2 * config.kv_heads) * config.head_dim, bias=False)
        self.wo = nn.Linear(config.dim, config.dim, bias=False)
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, x, rotation, mask, cache=None, slots=None):
        """x [B, n, dim] at `slots` [n]. mask: bool [B, 1, n, keys] or None (plain causal). cache: (K, V)
        [B, kv_heads, S, head_dim] of the decode state; this call's K/V are written there at `slots` first,
        then the queries attend over all S slots (the mask says which are visible)."""
        batch, n, _ = x.shape
        kv_size = self.n_kv_head * self.head_dim
        q, k, v = self.wqkv(x).split([self.n_head * self.head_dim, kv_size, kv_size], dim=-1)
        q = q.view(batch, n, self.n_head, self.head_dim)
        k = k.view(batch, n, self.n_kv_head, self.head_dim)
        v = v.view(batch, n, self.n_kv_head, self.head_dim)
        if rotation is not None:
            q, k = apply_rotary(q, *rotation), apply_rotary(k, *rotation)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if cache is not None:
            keys, values = cache
            keys.index_copy_(2, slots, k)
            values.index_copy_(2, slots, v)
            k, v = keys, values
        if self.n_kv_head != self.n_head:
            k = k.repeat_interleave(self.n_head // self.n_kv_head, dim=1)
            v = v.repeat_interleave(self.n_head // self.n_kv_head, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None)
        return self.resid_dropout(self.wo(out.transpose(1, 2).reshape(batch, n, -1)))


class TransformerBlock(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.attention = Attention(config)
        self.feed_forward = FeedForward(config)
        self.attention_norm = RMSNorm(config.dim, config.norm_eps)
        self.ffn_norm = RMSNorm(config.dim, config.norm_eps)

    def forward(self, x, rotation, mask, cache=None, slots=None):
        x = x + self.attention(self.attention_norm(x), rotation, mask, cache, slots)
        return x + self.feed_forward(self.ffn_norm(x))


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

    @torch.inference_mode()
    def step(self, state: DecodeState, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Write tokens [B, n] at grid positions [n] and return guided logits [B, n, V]; logits[:, i] is the
        next-token distribution for grid position positions[i] + 1."""
        c = self.config
        if state.cond_len != c.cond_len or state.num_slots != c.num_slots or len(state.keys) != c.n_layer:
            raise ValueError("this DecodeState was not made by this model's `start`")
        slots = check_step(state, tokens, positions, c.num_tokens, c.vocab_size)
        tokens = tokens.to(device=slots.device, dtype=torch.long)
        if state.guided:
            tokens = torch.cat([tokens, tokens])
        state.mark_written(slots)
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
        c = self.config
        if state.cond_len != c.cond_len or state.num_slots != c.num_slots or len(state.keys) != c.n_layer:
            raise ValueError("this DecodeState was not made by this model's `start`")
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
        in_prefix = (grid < 0)[:, None]
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

    # ---- official checkpoints ---------------------------------------------------------------------

    @classmethod
    def from_official(
        cls,
        path: str | Path | OfficialCheckpoint,
        config: GPTConfig | None = None,
        device: str | torch.device = "cpu",
        *,
        weights: str = "model",
        trust_pickle: bool = False,
        **settings,
    ) -> GPT:
        """Load a LlamaGen GPT file (t2i or c2i: `{"model": state_dict, ...}`, e.g. t2i_XL_stage1_256.pt or a
        training checkpoint with its `args`) or a Tar AR-DTok one (`{"model": {"name", "args", "sd"}}`, e.g.
        ar_dtok_lp_256px.pth), by path or as an `OfficialCheckpoint` already read. File reading, safe
        unpickling and `trust_pickle`: mulo_sd/llamagen/official.py.

        config None: the config is read from the file (official_configs.gpt_fields): its stored training
        settings, else `settings` (LlamaGen: model_size, image_size, downsample_size, cls_token_num,
        num_classes, n_head; Tar: model_size, cls_token_num, max_seq_len, cond_len, n_head), else the weights'
        shapes. A given config must agree with the settings the file stores.
        weights: "model" (what LlamaGen's sample scripts load) or "ema".

        LlamaGen's t2i `uncond_embedding` has 120 rows whatever cls_token_num is (CaptionEmbedder's
        token_num); its prefix is `cls_embedding(caption)[:, :cls_token_num]`, a per-row projection, so only
        the first cls_token_num rows ever act. Those are the rows kept.
        """
        if isinstance(path, OfficialCheckpoint):  # already read (mulo-convert reads it once)
            checkpoint = path
        else:
            checkpoint = read_official(path, trust_pickle=trust_pickle, missing_hint=OFFICIAL_GPT_SOURCES)
        path = checkpoint.path
        checkpoint.expect("llamagen-gpt", "tar-ar-dtok")
        state = dict(checkpoint.weights(weights))
        if config is None:
            config = GPTConfig(**gpt_fields(checkpoint, state, **settings).values)
        elif settings:
            raise TypeError(f"pass either a config or settings {sorted(settings)}, not both")
        else:
            check_gpt_config(config, checkpoint)
        uncond = "cls_embedding.uncond_embedding"
        if config.cond_type == "t5" and uncond in state:
            if state[uncond].shape[0] < config.cond_len:
                rows = state[uncond].shape[0]
                raise ValueError(f"{path}: {uncond} has {rows} rows, fewer than cond_len {config.cond_len}")
            state[uncond] = state[uncond][: config.cond_len]
        model = cls(config)
        expected = model.state_dict()
        missing = sorted(set(expected) - set(state))
        unexpected = sorted(set(state) - set(expected))
        mismatched = [
            f"{k}: checkpoint {list(state[k].shape)} vs model {list(v.shape)}"
            for k, v in expected.items()
            if k in state and state[k].shape != v.shape
        ]
        if missing or unexpected or mismatched:
            raise ValueError(
                f"{path} does not match GPT({config}):\n"
                f"  missing ({len(missing)}): {missing[:10]}\n"
                f"  unexpected ({len(unexpected)}): {unexpected[:10]}\n"
                f"  shape mismatches ({len(mismatched)}): {mismatched[:10]}"
            )
        model.load_state_dict(state, strict=True)
        return model.to(device).eval()


def rotary_angles(position: str, head_dim: int, base: float, width: int, grid: torch.Tensor) -> torch.Tensor:
    """Rotation angles [n, head_dim/2] of grid indices [n] ('rope2d': rows then columns of a grid `width`
    wide; 'rope1d': the index), in float32 like LlamaGen's tables."""
    if position == "rope2d":
        half = head_dim // 2
        exponents = torch.arange(0, half, 2, device=grid.device)[: half // 2].float() / half
        freqs = 1.0 / base**exponents
        rows, cols = grid.div(width, rounding_mode="floor"), grid.remainder(width)
        return torch.cat([rows.float()[:, None] * freqs, cols.float()[:, None] * freqs], dim=-1)
    exponents = torch.arange(0, head_dim, 2, device=grid.device).float() / head_dim
    return grid.float()[:, None] * (1.0 / base**exponents)


def _check_range(ids: torch.Tensor, size: int, name: str) -> None:
    low, high = (int(v) for v in torch.stack([ids.min(), ids.max()]).tolist())
    if low < 0 or high >= size:
        raise ValueError(f"{name} must lie in [0, {size}), got min {low} max {high}")
