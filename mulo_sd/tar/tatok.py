"""TA-Tok codes -> the features Tar's AR-DTok is conditioned on (its `clip_cond` prefix).

Tar does not condition the AR-DTok on raw codebook rows. Tar's tok/mm_autoencoder.py
(`decode_from_encoder_indices`) maps the MLLM's codes through TA-Tok's `decode_from_bottleneck`
(Tar's tok/ta_tok.py), which is:
1. the SimVQ codebook entry: `embedding_proj(embedding.weight)[ids]`, L2-normalised when the quantizer was
   built with `l2_normalized` (Tar's tok/ar_dtok/bottleneck.py, `SimVectorQuantizer.get_codebook_entry`);
2. the bottleneck's `out_linear` (`Bottleneck.decode`; absent, i.e. the identity, when `bottleneck_dim` <= 0);
3. the TA-Tok decoder: a SigLIP2 vision transformer with patch size 1 over the square grid of codes (its
   position table resized to the grid by transformers' Siglip2VisionModel), then `decode_task_layer`
   (Linear, Tanh, Linear). Its width is the SigLIP2 teacher's hidden size (1152 for so400m).
The decoder's sizes are read off the weights; what Tar leaves at Siglip2VisionConfig's defaults (12 heads,
activation, layer-norm eps) stays at those defaults here too. Tar's files store no head count; a file's
`args.decoder_num_heads`, when present, overrides it (tiny test checkpoints, whose width is not a multiple
of 12, set it).

Code grid: the SigLIP2 encoder's patch grid (its position table `encoder.embeddings.position_embedding`, 729
rows = 27 x 27 for so400m-patch14-384), average-pooled by pool_scale = scale + 1 with floor (Tar's
tok/ta_tok.py `avg_pool`): 27, 13 and 9 codes a side for the scale tokens <S0>, <S1>, <S2>.

File layout (`ta_tok.pth`): `torch.save({"model": {"args": {...}, "sd": state_dict}})`, read with
`weights_only=True` (nothing but tensors and plain containers is unpickled; a file that needs more is refused
naming what: mulo_sd/nets/safe_files.py) and `mmap=True`: the file also holds the SigLIP2 encoder
(`encoder.*`), which generation does not need.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from transformers import Siglip2VisionConfig, Siglip2VisionModel

from mulo_sd.nets.safe_files import UnreadableTorchFile, UnsafePickleError, load_torch_file

CODEBOOK_KEY = "bottleneck.regularizer.embedding.weight"
ENCODER_POSITIONS_KEY = "encoder.embeddings.position_embedding.weight"
# Tar's key prefix -> this module's (Tar's decoder pooling head `decoder.vision_model.head.*` is unused)
KEY_PREFIXES = {
    "bottleneck.regularizer.embedding.": "embedding.",
    "bottleneck.regularizer.embedding_proj.": "embedding_proj.",
    "bottleneck.out_linear.": "out_linear.",
    "decoder.vision_model.embeddings.": "decoder.vision_model.embeddings.",
    "decoder.vision_model.encoder.": "decoder.vision_model.encoder.",
    "decoder.vision_model.post_layernorm.": "decoder.vision_model.post_layernorm.",
    "decode_task_layer.": "decode_task_layer.",
}


class TATokError(ValueError):
    """A TA-Tok checkpoint that is unreadable or lacks what code -> feature decoding needs."""


class TATokDecoder(nn.Module):
    """TA-Tok code ids [B, N] (N a square grid) -> features [B, N, feature_dim] (module docstring)."""

    def __init__(self, state: dict[str, torch.Tensor], args: dict, path: Path):
        super().__init__()
        codebook_size, code_dim = state[CODEBOOK_KEY].shape
        regularizer = args.get("bottleneck", {}).get("args", {}).get("regularizer", {}).get("args", {})
        self.l2_normalized = bool(regularizer.get("l2_normalized", False))  # SimVectorQuantizer's default
        positions = _shape(state, ENCODER_POSITIONS_KEY, path)[0]
        self.encoder_side = round(positions**0.5)
        if self.encoder_side**2 != positions:
            raise TATokError(f"{path}: {ENCODER_POSITIONS_KEY} has {positions} rows, not a square grid")
        self.embedding = nn.Embedding(codebook_size, code_dim)
        self.embedding_proj = nn.Linear(code_dim, code_dim)
        out = state.get("bottleneck.out_linear.weight")
        self.out_linear = nn.Identity() if out is None else nn.Linear(out.shape[1], out.shape[0])
        width, channels = _shape(state, "decoder.vision_model.embeddings.patch_embedding.weight", path)
        layers = {
            key.split(".")[4] for key in state if key.startswith("decoder.vision_model.encoder.layers.")
        }
        config = Siglip2VisionConfig(
            hidden_size=width,
            intermediate_size=_shape(state, "decoder.vision_model.encoder.layers.0.mlp.fc1.weight", path)[0],
            num_hidden_layers=len(layers),
            num_channels=channels,
            num_patches=_shape(state, "decoder.vision_model.embeddings.position_embedding.weight", path)[0],
            num_attention_heads=args.get("decoder_num_heads", Siglip2VisionConfig().num_attention_heads),
            patch_size=1,
            vision_use_head=False,
            attn_implementation="sdpa",
        )
        if width % config.num_attention_heads:
            raise TATokError(
                f"{path}: the TA-Tok decoder's width {width} is not a multiple of its "
                f"{config.num_attention_heads} heads (args.decoder_num_heads, else SigLIP2's default)"
            )
        self.decoder = Siglip2VisionModel(config)
        self.decode_task_layer = nn.Sequential(nn.Linear(width, width), nn.Tanh(), nn.Linear(width, width))

    @classmethod
    def from_checkpoint(
        cls, path: str | Path, *, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
    ) -> TATokDecoder:
        path = Path(path)
        args, weights = _read(path)
        if CODEBOOK_KEY not in weights:
            raise TATokError(
                f"{path}: no TA-Tok codebook {CODEBOOK_KEY!r} under model.sd; the file has keys "
                f"{sorted(weights)[:12]}{' ...' if len(weights) > 12 else ''}"
            )
        state = {}
        for key, tensor in weights.items():
            for tar_prefix, prefix in KEY_PREFIXES.items():
                if key.startswith(tar_prefix):
                    state[prefix + key[len(tar_prefix) :]] = tensor
        tatok = cls(weights, args, path)
        missing, _ = tatok.load_state_dict(state, strict=False)
        if missing:
            wanted = {v: k for k, v in KEY_PREFIXES.items()}
            named = [wanted[p] + k[len(p) :] for k in missing for p in wanted if k.startswith(p)]
            raise TATokError(f"{path}: the TA-Tok decoder weights {named[:8]} are missing from model.sd")
        return tatok.to(device=device, dtype=dtype).eval().requires_grad_(False)

    @property
    def codebook_size(self) -> int:
        return self.embedding.num_embeddings

    @property
    def feature_dim(self) -> int:
        return self.decoder.config.hidden_size

    def grid_side(self, scale: int) -> int:
        """Codes per side of the grid for Tar's scale token <S{scale}> (module docstring)."""
        return self.encoder_side // (scale + 1)

    def codebook_entries(self, ids: torch.Tensor) -> torch.Tensor:
        """Steps 1-2 of the module docstring: ids [...] -> [..., decoder input width]."""
        rows = self.embedding_proj(self.embedding(ids))
        if self.l2_normalized:  # normalising the projected rows, then the picked ones, is the same
            rows = nn.functional.normalize(rows, dim=-1)
        return self.out_linear(rows)

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        batch, tokens = ids.shape
        side = round(tokens**0.5)
        if side * side != tokens:
            raise ValueError(f"TA-Tok decodes a square grid of codes, got {tokens} per image")
        codes = self.codebook_entries(ids.to(self.embedding.weight.device))
        every = torch.ones(batch, tokens, dtype=torch.long, device=codes.device)
        shapes = torch.tensor([[side, side]] * batch, device=codes.device)
        hidden = self.decoder(codes, every, shapes).last_hidden_state
        return self.decode_task_layer(hidden)


def _read(path: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    if not path.is_file():
        raise FileNotFoundError(
            f"TA-Tok checkpoint {path} not found (ta_tok.pth from huggingface.co/csuhan/TA-Tok)"
        )
    try:
        checkpoint = load_torch_file(path, mmap=True)
    except (UnsafePickleError, UnreadableTorchFile) as error:
        raise TATokError(str(error)) from None
    spec = checkpoint.get("model") if isinstance(checkpoint, dict) else None
    if not isinstance(spec, dict) or not isinstance(spec.get("sd"), dict):
        found = (
            sorted(map(str, checkpoint))[:8] if isinstance(checkpoint, dict) else type(checkpoint).__name__
        )
        raise TATokError(
            f"{path}: expected Tar's layout {{'model': {{'args': ..., 'sd': ...}}}}, found {found}"
        )
    args = spec.get("args")
    return (args if isinstance(args, dict) else {}), spec["sd"]


def _shape(state: dict[str, torch.Tensor], key: str, path: Path) -> torch.Size:
    if key not in state:
        raise TATokError(f"{path}: the TA-Tok decoder weight {key!r} is missing from model.sd")
    return state[key].shape
