"""EAGLE's feature-level draft head (Li et al., 2024; SafeAILab/EAGLE `eagle/model/cnets.py`): one decoder
layer over the target GPT's own feature sequence (docs/eagle2.md).

Input at grid position p: `fc([e(x_p), f_p])`, the target's (frozen) embedding of token x_p concatenated with
the target's final hidden features f_p (the features whose output head gives the distribution of x_p). The
decoder layer (the GPT's pre-norm attention and SwiGLU block, transformer.py, without the attention input
norm, as EAGLE's first layer) predicts f_{p+1}; the target's frozen output head turns it into the draft
distribution of x_{p+1}.
The head owns no embedding and no output head: it is trained for one target and used with it
(`check_target`). Positions: rotary over the grid like the target ('rope1d' for targets with absolute
positions). Decoding keeps the head's K/V in a `DecodeState` of one layer over the grid slots (no prefix);
under classifier-free guidance its rows are doubled like the target's, the unconditional rows reading the
target's unconditional features.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from mulo_sd.nets.gpt import GPT
from mulo_sd.nets.gpt_config import BlockDims, GPTConfig
from mulo_sd.nets.io import Pretrained
from mulo_sd.nets.slot_cache import DecodeState
from mulo_sd.nets.transformer import TransformerBlock, rotary_angles

HEAD_POSITIONS = ("rope2d", "rope1d")


@dataclass
class EagleHeadConfig(BlockDims):
    vocab_size: int  # the target's
    grid_size: tuple[int, int]  # the target's
    dim: int  # the target's width (features in and out)
    n_head: int
    n_kv_head: int | None = None
    multiple_of: int = 256
    ffn_dim_multiplier: float | None = None
    norm_eps: float = 1e-5
    rope_base: float = 10000.0
    position: str = "rope2d"  # one of HEAD_POSITIONS
    dropout: float = 0.0
    initializer_range: float = 0.02

    def __post_init__(self):
        size = self.grid_size
        self.grid_size = (size, size) if isinstance(size, int) else tuple(int(s) for s in size)
        if self.position not in HEAD_POSITIONS:
            raise ValueError(f"position must be one of {HEAD_POSITIONS}, got '{self.position}'")
        if self.dim % self.n_head or self.n_head % self.kv_heads:
            raise ValueError(f"dim {self.dim}, n_head {self.n_head}, n_kv_head {self.kv_heads} do not divide")

    @classmethod
    def for_target(cls, target: GPTConfig, **overrides) -> EagleHeadConfig:
        """A head for `target`: its vocabulary, grid, width and attention shape unless overridden."""
        fields = dict(
            vocab_size=target.vocab_size, grid_size=target.grid_size, dim=target.dim, n_head=target.n_head,
            n_kv_head=target.n_kv_head, multiple_of=target.multiple_of, norm_eps=target.norm_eps,
            ffn_dim_multiplier=target.ffn_dim_multiplier, rope_base=target.rope_base,
            position=target.position if target.position in HEAD_POSITIONS else "rope1d",
        )  # fmt: skip
        return cls(**{**fields, **overrides})


class EagleHead(nn.Module, Pretrained):
    kind = "eagle_head"
    config_class = EagleHeadConfig

    def __init__(self, config: EagleHeadConfig):
        super().__init__()
        self.config = config
        self.fc = nn.Linear(2 * config.dim, config.dim)
        self.layer = TransformerBlock(config)
        self.layer.attention_norm = nn.Identity()  # EAGLE's layer 0 reads fc's output unnormalised
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=config.initializer_range)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)

    @property
    def device(self) -> torch.device:
        return self.fc.weight.device

    def check_target(self, target: GPT) -> None:
        """Raise unless `target` is the kind of GPT this head was trained on (vocabulary, grid, width)."""
        c, t = self.config, target.config
        wanted = {"vocab_size": c.vocab_size, "grid_size": c.grid_size, "dim": c.dim}
        wrong = {name: getattr(t, name) for name, value in wanted.items() if getattr(t, name) != value}
        if wrong:
            raise ValueError(
                f"the EAGLE head was trained for a target with {wanted}; this target has {wrong}"
            )

    def forward(self, features: torch.Tensor, embeddings: torch.Tensor) -> torch.Tensor:
        """Teacher forcing over grid positions 0..T-1: features, embeddings [B, T, dim] -> predicted features
        [B, T, dim] of positions 1..T."""
        positions = torch.arange(features.shape[1], device=features.device)
        return self._run(features, embeddings, positions, None, None, positions)

    # ---- decoding -----------------------------------------------------------------------------------

    def start(self, rows: int, cfg_scale: float, tree_slots: int) -> DecodeState:
        """An empty head cache for `rows` internal rows (doubled under guidance), with tree slots."""
        c = self.config
        state = DecodeState.allocate(
            1, rows, c.kv_heads, c.num_tokens, c.head_dim, 0, cfg_scale, self.fc.weight.dtype, self.device
        )
        state.add_tree_slots(tree_slots)
        return state

    @torch.inference_mode()
    def step(self, state, features, embeddings, positions, parents=None, first: int = 0) -> torch.Tensor:
        """Feed [B', n, dim] features and embeddings; returns predicted features [B', n, dim]. parents None:
        a chain at grid `positions` [n], written to the grid slots. Else tree nodes first .. first+n-1,
        written to those tree slots, of a tree whose nodes so far sit at `positions` [first+n] with `parents`
        [first+n] (-1: a root); each sees its ancestors and the grid slots before its root (slot_cache.py)."""
        positions = positions.to(self.device)
        if parents is None:
            state.mark_written(positions)
            return self._run(
                features, embeddings, positions, state.attention_mask(positions), state, positions
            )
        n = features.shape[1]
        if parents.shape != positions.shape or not 0 <= first == positions.shape[0] - n:
            raise ValueError(
                f"tree nodes {first}..{first + n - 1} need the positions and parents of every node so far, "
                f"got {positions.shape[0]} positions and {parents.shape[0]} parents"
            )
        if positions.shape[0] > state.tree_slots:
            raise ValueError(
                f"{positions.shape[0]} tree nodes exceed the state's {state.tree_slots} tree slots"
            )
        mask = state.tree_attention_mask(positions, parents.to(self.device), first)
        scratch = state.num_slots + torch.arange(first, first + n, device=self.device)
        return self._run(features, embeddings, positions[first:], mask, state, scratch)

    def _run(self, features, embeddings, positions, mask, state, write_slots) -> torch.Tensor:
        c = self.config
        x = self.fc(torch.cat([embeddings, features.to(embeddings.dtype)], dim=-1))
        angles = rotary_angles(c.position, c.head_dim, c.rope_base, c.grid_size[1], positions)
        cache = None if state is None else (state.keys[0], state.values[0])
        return self.layer(x, (angles.cos(), angles.sin()), mask, cache, write_slots)
