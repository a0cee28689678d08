"""The learned latent up-sampler U_r: a low-resolution token grid [B, h, w] -> high-resolution tokens
[B, r*h, r*w], row-causal so that MuLo-SD can up-sample only the rows the drafter has just added.

Layout: token embedding (frozen codebook vectors + 1x1 conv, or a learned table) -> residual blocks of
row-causal masked convs (masked_conv.py) -> per-position LayerNorm, SiLU -> 1x1 conv to C_out * r^2 ->
PixelShuffle(r). C_out is the codebook size (logits, token cross-entropy) and/or the code dimension (a
continuous code per high-res position, for pixel losses through the frozen VQ decoder). PixelShuffle puts the
r x r children of low-res position (a, b) at high-res rows r*a .. r*a + r - 1, so high-res row i depends only
on low-res rows <= i // r.

Every sampler stores the codebook it was trained for (the vectors as the tokenizer uses them, [V, D]): the
'codebook' embedding reads it, the 'code' output is quantised against it, and `check_tokenizer` compares it
with a tokenizer's before decoding. The functions at the bottom (`soft_codes`, `straight_through_codes`,
`nearest_entries`) turn the up-sampler's outputs into differentiable codes for the trainer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from mulo_sd.nets.caption_film import CONDITIONS, CaptionFiLM, modulate
from mulo_sd.nets.io import Pretrained
from mulo_sd.nets.masked_conv import NORMS, ChannelLayerNorm, RowCausalBlock, context_rows

EMBEDDINGS = ("codebook", "learned")
OUTPUTS = ("logits", "code", "both")
# Largest elementwise difference between a sampler's stored codebook and a tokenizer's that still counts as
# the same codebook: covers a bfloat16 save of unit-norm vectors (error <= 2^-8), far below how much two
# separately trained codebooks differ.
CODEBOOK_TOLERANCE = 1e-2
# Spread of the hypotheses' initial shifts: the features they shift are LayerNorm'd (unit scale)
HYPOTHESIS_INIT_STD = 0.5


def check_sampler_fields(config) -> None:
    """Checks shared by UpsamplerConfig and DownsamplerConfig."""
    name = type(config).__name__
    for field in ("r", "codebook_size", "code_dim", "width", "kernel"):
        if getattr(config, field) < 1:
            raise ValueError(f"{name}.{field} must be >= 1, got {getattr(config, field)}")
    if config.r < 2:
        raise ValueError(f"{name}.r must be >= 2 (the scale between the grids), got {config.r}")
    if config.blocks < 0:
        raise ValueError(f"{name}.blocks must be >= 0, got {config.blocks}")
    if config.kernel % 2 == 0:
        raise ValueError(
            f"{name}.kernel must be odd (the centre row is the output's own row), got {config.kernel}"
        )
    if config.embedding not in EMBEDDINGS:
        raise ValueError(f"{name}.embedding must be one of {EMBEDDINGS}, got '{config.embedding}'")
    if config.norm not in NORMS:
        raise ValueError(
            f"{name}.norm must be one of {NORMS}, got '{config.norm}' (GroupNorm/BatchNorm pool statistics "
            f"over all rows and would break row causality)"
        )


@dataclass
class UpsamplerConfig:
    r: int  # scale: a low-res token becomes r x r high-res tokens
    codebook_size: int  # V of the tokenizer
    code_dim: int  # D of the tokenizer's codebook vectors
    embedding: str = "codebook"  # 'codebook': frozen codebook vectors + 1x1 conv; 'learned': [V, width] table
    width: int = 256
    blocks: int = 6
    kernel: int = 3
    norm: str = "layer"  # 'layer': LayerNorm over channels per position; 'none'
    output: str = "logits"  # 'logits' [B,V,rh,rw]; 'code' [B,D,rh,rw]; 'both'
    # False: the convs also see the rows below (masked_conv.py), like the pixel-space path; new rows are then
    # computed from the whole prefix, which matches training only when the whole low-res grid is drafted at
    # once (MuLo-SD's default rows_per_cycle=None)
    causal: bool = True
    # 'words' / 'features': the up-sampler also reads the caption as the target takes it (caption_film.py):
    # word ids of a vocabulary of `condition_vocab`, or `condition_dim`-wide feature rows; 'none': tokens only
    condition: str = "none"
    condition_vocab: int = 0
    condition_dim: int = 0
    # decoding's default knobs.draft_temperature for these weights (chosen on dev prompts): 0 drafts the
    # argmax code, > 0 draws each draft token from softmax(logits / draft_temperature)
    draft_temperature: float = 0.0
    # > 1: the up-sampler drafts one of this many hypotheses, a learned shift of the features before its last
    # block, trained winner-takes-all (training/losses/token.py): where the low-res grid leaves a texture's
    # phase open (a stripe a low-res token wide), each hypothesis commits to one instead of drafting their
    # mean; decoding draws one per image with its generator (`hypothesis=`)
    hypotheses: int = 1

    def __post_init__(self):
        check_sampler_fields(self)
        if self.hypotheses < 1:
            raise ValueError(f"UpsamplerConfig.hypotheses must be >= 1, got {self.hypotheses}")
        if self.hypotheses > 1 and self.blocks < 1:
            raise ValueError(
                "UpsamplerConfig.hypotheses > 1 needs blocks >= 1 (the shift enters the last block)"
            )
        if not self.draft_temperature >= 0.0:  # also NaN
            raise ValueError(f"UpsamplerConfig.draft_temperature must be >= 0, got {self.draft_temperature}")
        if self.output not in OUTPUTS:
            raise ValueError(f"UpsamplerConfig.output must be one of {OUTPUTS}, got '{self.output}'")
        if self.condition not in CONDITIONS:
            raise ValueError(f"UpsamplerConfig.condition must be one of {CONDITIONS}, got '{self.condition}'")
        needs = {"words": "condition_vocab", "features": "condition_dim"}.get(self.condition)
        if needs is not None and getattr(self, needs) < 1:
            raise ValueError(f"UpsamplerConfig.condition '{self.condition}' needs {needs} >= 1")


def check_token_grid(ids: torch.Tensor, codebook_size: int, what: str = "ids") -> None:
    if ids.dim() != 3:
        raise ValueError(f"{what} must be [B, h, w], got shape {tuple(ids.shape)}")
    if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        raise ValueError(f"{what} must be an integer tensor, got {ids.dtype}")
    if ids.numel() and (ids.min() < 0 or ids.max() >= codebook_size):
        raise ValueError(f"{what} must lie in [0, {codebook_size}), got range [{ids.min()}, {ids.max()}]")


def check_codebook_match(owner: str, codebook: torch.Tensor, vq) -> None:
    """Raise unless `vq` (anything with codebook_size, code_dim, codebook) has the codebook `owner` was made
    for: same shape, and the same vectors up to CODEBOOK_TOLERANCE."""
    entries, dims = codebook.shape
    if (vq.codebook_size, vq.code_dim) != (entries, dims):
        raise ValueError(
            f"{owner} trained for codebook ({entries} entries, {dims} dims) but tokenizer has "
            f"{vq.codebook_size} entries, {vq.code_dim} dims"
        )
    theirs = vq.codebook.detach().to(device=codebook.device, dtype=torch.float32)
    diff = (codebook.float() - theirs).abs().max().item()
    if diff > CODEBOOK_TOLERANCE:
        raise ValueError(
            f"{owner} trained for codebook ({entries} entries, {dims} dims) but tokenizer has other "
            f"vectors of that shape (max difference {diff:.3g} > {CODEBOOK_TOLERANCE}): use the tokenizer "
            f"the sampler was trained with (a sampler built without `codebook=` holds zeros)"
        )


class TokenGridModel(nn.Module):
    """What the learned up- and down-sampler share: the stored codebook, the token embedding, input checks."""

    def __init__(self, config, codebook: torch.Tensor | None):
        super().__init__()
        self.config = config
        shape = (config.codebook_size, config.code_dim)
        if codebook is None:
            # `from_pretrained` builds without one, then loads the saved vectors
            codebook = torch.zeros(shape)
        elif tuple(codebook.shape) != shape:
            raise ValueError(
                f"codebook has shape {tuple(codebook.shape)} but the config says {shape} "
                f"(codebook_size, code_dim)"
            )
        self.register_buffer("codebook", codebook.detach().to(torch.float32).clone())
        if config.embedding == "codebook":
            self.embed_proj = nn.Conv2d(config.code_dim, config.width, 1)
        else:
            self.embed_table = nn.Embedding(config.codebook_size, config.width)

    @property
    def r(self) -> int:
        return self.config.r

    @property
    def codebook_size(self) -> int:
        return self.config.codebook_size

    @property
    def code_dim(self) -> int:
        return self.config.code_dim

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [B, h, w] -> features [B, width, h, w]; pointwise, so row causality is untouched."""
        if self.config.embedding == "codebook":
            vectors = F.embedding(ids, self.codebook).permute(0, 3, 1, 2)
            return self.embed_proj(vectors.to(self.embed_proj.weight.dtype))
        return self.embed_table(ids).permute(0, 3, 1, 2)

    def check_tokenizer(self, vq) -> None:
        check_codebook_match(self.kind, self.codebook, vq)


class Upsampler(TokenGridModel, Pretrained):
    """Learned row-causal up-sampler; build it with the tokenizer's codebook: `Upsampler(config, vq.codebook)`
    (`from_pretrained` needs none: the codebook is saved with the weights)."""

    kind = "upsampler"
    config_class = UpsamplerConfig

    def __init__(self, config: UpsamplerConfig, codebook: torch.Tensor | None = None):
        super().__init__(config, codebook)
        self.blocks = nn.ModuleList(
            RowCausalBlock(config.width, config.kernel, config.norm, config.causal)
            for _ in range(config.blocks)
        )
        self.norm_out = ChannelLayerNorm(config.width) if config.norm == "layer" else nn.Identity()
        r2 = config.r * config.r
        has_logits, has_code = config.output in ("logits", "both"), config.output in ("code", "both")
        self.logits_head = nn.Conv2d(config.width, config.codebook_size * r2, 1) if has_logits else None
        self.code_head = nn.Conv2d(config.width, config.code_dim * r2, 1) if has_code else None
        self.hypothesis_shift = None
        if config.hypotheses > 1:  # apart from the start, so that winner-takes-all training splits them
            self.hypothesis_shift = nn.Embedding(config.hypotheses, config.width)
            nn.init.normal_(self.hypothesis_shift.weight, std=HYPOTHESIS_INIT_STD)
        self.caption = None
        if self.conditioned:  # one scale and shift after the embedding and after each block
            self.caption = CaptionFiLM(
                config.condition,
                config.width,
                config.blocks + 1,
                config.condition_vocab,
                config.condition_dim,
            )

    @property
    def conditioned(self) -> bool:
        """Whether the up-sampler also reads the caption (`cond`, as the target takes it)."""
        return self.config.condition != "none"

    @property
    def context_rows(self) -> int:
        """Low-res rows above a row that its high-res rows depend on (blocks * (kernel // 2)); a non-causal
        up-sampler also reaches as many rows below."""
        return context_rows(self.blocks)

    @property
    def hypotheses(self) -> int:
        return self.config.hypotheses

    def forward(
        self,
        ids: torch.Tensor,
        cond: torch.Tensor | None = None,
        cond_mask: torch.Tensor | None = None,
        hypothesis: torch.Tensor | None = None,
    ) -> dict[str, torch.Tensor]:
        """ids [B, h, w] (and for a conditioned up-sampler the caption `cond` [B, L] or [B, L, D] and
        `cond_mask`) -> {'logits': [B, V, r*h, r*w]} and/or {'codes': [B, D, r*h, r*w]} (by `output`).
        `hypothesis`: int64 [B], which hypothesis each grid drafts (None: hypothesis 0)."""
        check_token_grid(ids, self.codebook_size)
        hypothesis = self._hypothesis_ids(hypothesis, ids.shape[0], ids.device)
        return self._run(ids, cond, cond_mask, hypothesis, 1)

    def all_hypotheses(self, ids: torch.Tensor, cond=None, cond_mask=None) -> dict[str, torch.Tensor]:
        """`forward` for every hypothesis at once, the layers before the last block run once: each output
        [B, K, C, r*h, r*w] (K = config.hypotheses), for winner-takes-all training."""
        check_token_grid(ids, self.codebook_size)
        k = self.hypotheses
        hypothesis = torch.arange(k, device=ids.device).repeat(ids.shape[0]) if k > 1 else None
        out = self._run(ids, cond, cond_mask, hypothesis, k)
        return {name: value.view(ids.shape[0], k, *value.shape[1:]) for name, value in out.items()}

    def _run(self, ids, cond, cond_mask, hypothesis, repeat: int) -> dict[str, torch.Tensor]:
        """The layers; before the last block the features are repeated `repeat` times per grid and shifted
        by `hypothesis` [B * repeat] (None: unshifted)."""
        films = self.caption_films(ids, cond, cond_mask)
        x = self.embed(ids)
        if films:
            x = modulate(x, films[0])
        for i, block in enumerate(self.blocks):
            if i == len(self.blocks) - 1 and hypothesis is not None:
                if repeat > 1:
                    x = x.repeat_interleave(repeat, 0)
                    films = [tuple(part.repeat_interleave(repeat, 0) for part in film) for film in films]
                x = x + self.hypothesis_shift(hypothesis)[:, :, None, None].to(x.dtype)
            x = block(x)
            if films:
                x = modulate(x, films[i + 1])
        x = F.silu(self.norm_out(x))
        out = {}
        if self.logits_head is not None:
            out["logits"] = F.pixel_shuffle(self.logits_head(x), self.r)
        if self.code_head is not None:
            out["codes"] = F.pixel_shuffle(self.code_head(x), self.r)
        return out

    def _hypothesis_ids(self, hypothesis, batch: int, device) -> torch.Tensor | None:
        if self.hypothesis_shift is None:
            if hypothesis is not None and bool((hypothesis != 0).any()):
                raise ValueError("this up-sampler has one hypothesis (config.hypotheses 1): pass none or 0")
            return None
        if hypothesis is None:
            return torch.zeros(batch, dtype=torch.long, device=device)
        if hypothesis.shape != (batch,) or hypothesis.dtype != torch.long:
            raise ValueError(
                f"hypothesis must be int64 [{batch}], got {hypothesis.dtype} {tuple(hypothesis.shape)}"
            )
        if bool(((hypothesis < 0) | (hypothesis >= self.hypotheses)).any()):
            raise ValueError(f"hypothesis must lie in [0, {self.hypotheses}), got {hypothesis.tolist()}")
        return hypothesis.to(device)

    def caption_films(self, ids, cond, cond_mask) -> list:
        if self.caption is None:
            if cond is not None:
                raise ValueError("this up-sampler reads no caption (config.condition 'none'): pass no cond")
            return []
        if cond is None:
            raise ValueError(
                f"this up-sampler reads the caption (config.condition '{self.config.condition}'): pass cond, "
                f"the caption as the target takes it"
            )
        if cond.shape[0] != ids.shape[0]:
            raise ValueError(f"cond has {cond.shape[0]} captions for {ids.shape[0]} token grids")
        return self.caption(cond.to(ids.device), cond_mask)

    def tokens(self, out: dict[str, torch.Tensor]) -> torch.Tensor:
        """Token ids from `forward`'s output: argmax of the logits when there are logits (also for 'both'),
        else the nearest stored codebook entry of the predicted code."""
        if "logits" in out:
            return out["logits"].argmax(1)
        return nearest_entries(out["codes"], self.codebook)

    @torch.no_grad()
    def upsample(self, ids: torch.Tensor, cond=None, cond_mask=None, hypothesis=None) -> torch.Tensor:
        """ids [B, h, w] -> ids [B, r*h, r*w]."""
        return self.tokens(self(ids, cond, cond_mask, hypothesis))

    @torch.no_grad()
    def upsample_rows(
        self, ids_low: torch.Tensor, first_row: int, windowed: bool = True, **inputs
    ) -> torch.Tensor:
        """High-res rows r*first_row .. r*n - 1 for the low-res prefix ids_low [B, n, w]: [B, r*(n-first_row),
        r*w], equal to those rows of `upsample` on any grid that starts with this prefix. `windowed` feeds
        only the `context_rows` rows above `first_row` (all the new rows depend on) instead of the prefix.
        A non-causal up-sampler (`causal=False`) computes them from the whole prefix, as the pixel path.
        `inputs`: `forward`'s cond, cond_mask (the caption, for a conditioned up-sampler) and hypothesis."""
        return self.tokens(self._rows_outputs(ids_low, first_row, windowed, inputs))

    @torch.no_grad()
    def upsample_rows_logits(
        self, ids_low: torch.Tensor, first_row: int, windowed: bool = True, **inputs
    ) -> torch.Tensor:
        """The logits behind `upsample_rows` (its argmax): [B, V, r*(n-first_row), r*w], for drafts sampled
        from the up-sampler instead of its most likely code. An up-sampler with a code head only has none."""
        if self.logits_head is None:
            raise ValueError(
                f"this up-sampler predicts codes only (config.output '{self.config.output}'), so it has no "
                f"logits to sample a draft from: use one with output 'logits' or 'both'"
            )
        return self._rows_outputs(ids_low, first_row, windowed, inputs)["logits"]

    def _rows_outputs(self, ids_low: torch.Tensor, first_row: int, windowed: bool, inputs: dict) -> dict:
        """`forward`'s outputs for the high-res rows from r*first_row, fed the rows they depend on."""
        start = self._first_context_row(ids_low, first_row, windowed)
        out = self(ids_low[:, start:], **inputs)
        return {name: value[:, :, self.r * (first_row - start) :] for name, value in out.items()}

    def _first_context_row(self, ids_low: torch.Tensor, first_row: int, windowed: bool) -> int:
        check_token_grid(ids_low, self.codebook_size, "ids_low")
        n = ids_low.shape[1]
        if not 0 <= first_row < n:
            raise ValueError(
                f"first_row must lie in [0, {n}) for a low-res prefix of {n} rows, got {first_row}"
            )
        return max(0, first_row - self.context_rows) if windowed and self.config.causal else 0


def nearest_entries(codes: torch.Tensor, codebook: torch.Tensor) -> torch.Tensor:
    """codes [B, D, H, W] -> ids [B, H, W] of the nearest codebook rows (squared Euclidean, float32). For a
    unit-norm codebook this equals the VQ's rule (normalise, then nearest): both pick the largest dot
    product."""
    b, d, h, w = codes.shape
    if codebook.shape[1] != d:
        raise ValueError(f"codes have {d} channels but the codebook has {codebook.shape[1]} dims")
    with torch.autocast(device_type=codes.device.type, enabled=False):
        z = codes.detach().permute(0, 2, 3, 1).reshape(-1, d).float()
        e = codebook.detach().float()
        distances = z.pow(2).sum(1, keepdim=True) + e.pow(2).sum(1) - 2 * z @ e.t()
    return distances.argmin(1).view(b, h, w)


def straight_through_codes(codes: torch.Tensor, codebook: torch.Tensor) -> torch.Tensor:
    """codes [B, D, H, W] -> their nearest codebook entries [B, D, H, W]; the gradient passes to `codes`
    unchanged (straight-through), so pixel losses through the VQ decoder train the code head."""
    ids = nearest_entries(codes, codebook)
    quantised = codebook[ids].permute(0, 3, 1, 2).to(codes.dtype)
    return codes + (quantised - codes).detach()


def soft_codes(logits: torch.Tensor, codebook: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """logits [B, V, H, W] -> the softmax(logits / temperature)-weighted mean of codebook rows [B, D, H, W];
    differentiable in the logits. Low temperatures approach the argmax entry."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if logits.shape[1] != codebook.shape[0]:
        raise ValueError(
            f"logits have {logits.shape[1]} classes but the codebook has {codebook.shape[0]} entries"
        )
    weights = torch.softmax(logits.float() / temperature, dim=1)
    return torch.einsum("bvhw,vd->bdhw", weights, codebook.float()).to(logits.dtype)
