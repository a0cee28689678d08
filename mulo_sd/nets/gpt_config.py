"""The GPT's config: vocabulary, grid, widths, condition prefix and positions, with their checks, and the
presets of the official LlamaGen t2i and Tar AR-DTok models (gpt.py describes the conditions and positions).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

CONDITIONS = ("words", "t5", "class", "tatok")
POSITIONS = ("rope2d", "rope1d", "absolute")
# How rotary positions treat the condition prefix. 'zero' is LlamaGen's: the prefix's queries and keys are
# multiplied by zero, so every grid query scores every prefix slot alike and reads a plain average of the
# prefix values (fine for contextual T5 features). 'identity' leaves them unrotated, so attention can pick
# words by content, which word-embedding captions need to bind colours to shapes.
PREFIX_ROTATIONS = ("zero", "identity")


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
        is wrong, `gpt_from_official` (mulo_sd/llamagen/official_models.py) names the real `abs_pe` shape;
        pass `n_positions` to match it.
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
