"""Caption conditioning for LlamaGen text-to-image: a FLAN-T5 encoder read from a local folder, with
LlamaGen's conventions (its language/t5.py, autoregressive/sample/sample_t2i.py and dataset/t2i.py):

- Tokenise with the folder's tokenizer, padded to `max_length` = 120 tokens and truncated there, the
  end-of-sequence token appended; run the T5 encoder with that attention mask; keep the last hidden state.
- Keep each caption's valid tokens and left-pad them: zero rows first, then the valid rows in order
  (LlamaGen's "left-padding": the flipped `emb_masks` and the rotation of the rows in sample_t2i.py, the
  `t5_feat_padding[:, -feat_len:]` of dataset/t2i.py). The mask is True on the valid rows.
- The GPT takes features [B, 120, 2048] and the mask: `gpt.start(features, cfg_scale, cond_mask=mask)` or
  `gpt(tokens, features, mask)`. Padding slots are hidden from every query but their own (LlamaGen's masked
  causal mask plus its diagonal; slot_cache.visible_slots); the last slot, which predicts the first image
  token, is always a real token.
- Classifier-free guidance: the unconditional rows are the GPT's `uncond_embedding` under the same mask, which
  `GPT.start` builds itself when cfg_scale != 1 (LlamaGen's generate: `cond_null = uncond_embedding`, masks
  repeated for both halves).
- Caption text: LlamaGen's T5Embedder lowercases and strips each caption and, by default, also runs PixArt's
  `clean_caption` (ftfy, BeautifulSoup and a list of regexes for URLs, HTML and punctuation). The default
  here is the lowercase-and-strip step; pass `preprocess` to run the full cleaning where it is installed.

`mulo-data pretokenize --text-encoder DIR` stores the valid rows per sample (member `FEATURES_MEMBER`, float32
[n, D]); `left_pad` turns a batch of them into exactly what the encoder returns.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from mulo_sd.nets.dtypes import resolve_dtype
from mulo_sd.nets.safe_files import check_pickled_weights

T5_MAX_LENGTH = 120  # LlamaGen's t5_feature_max_len and --cls-token-num
FEATURES_MEMBER = "t5.npy"  # webdataset member of pretokenized shards: valid T5 rows, float32 [n, D]
T5_FILES_HINT = (
    "put google/flan-t5-xl's files (config.json, tokenizer.json or spiece.model, tokenizer_config.json, "
    "special_tokens_map.json, and model.safetensors or its shards with model.safetensors.index.json) in "
    "{folder}"
)


def lowercase_strip(caption: str) -> str:
    """LlamaGen's caption text step without PixArt's clean_caption (T5Embedder with preprocessing off)."""
    return caption.lower().strip()


def left_pad(valid: Sequence[torch.Tensor], length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-caption valid rows [n_i, D] -> (features [B, length, D]: zero rows, then the valid rows; mask bool
    [B, length], True on the valid rows). Rows past `length` are dropped from the end, as dataset/t2i.py keeps
    a stored feature's first `length` rows."""
    if not valid:
        raise ValueError("left_pad needs at least one caption")
    width = {rows.shape[-1] for rows in valid}
    if len(width) != 1 or any(rows.dim() != 2 for rows in valid):
        raise ValueError(
            f"valid rows must be [n_i, D] with one D, got shapes {[list(r.shape) for r in valid]}"
        )
    first = valid[0]
    features = first.new_zeros(len(valid), length, width.pop())
    mask = torch.zeros(len(valid), length, dtype=torch.bool, device=first.device)
    for i, rows in enumerate(valid):
        n = min(rows.shape[0], length)
        if n:
            features[i, length - n :] = rows[:n]
            mask[i, length - n :] = True
    return features, mask


class T5TextEncoder:
    """FLAN-T5 encoder + tokenizer from a local folder (transformers' T5EncoderModel and AutoTokenizer;
    nothing is downloaded). `encoder(captions)` -> (features [B, max_length, d_model], mask bool
    [B, max_length])."""

    def __init__(
        self,
        folder: str | Path,
        device: str | torch.device = "cpu",
        dtype: str | torch.dtype = "float32",
        max_length: int = T5_MAX_LENGTH,
        preprocess: Callable[[str], str] = lowercase_strip,
    ):
        from transformers import AutoTokenizer, T5EncoderModel  # heavy import, only for text conditioning

        self.folder = Path(folder)
        check_t5_folder(self.folder)
        if max_length < 1:
            raise ValueError(f"max_length must be >= 1, got {max_length}")
        self.device = torch.device(device)
        self.dtype = resolve_dtype(dtype)
        self.max_length = max_length
        self.preprocess = preprocess
        self.tokenizer = AutoTokenizer.from_pretrained(self.folder, local_files_only=True)
        self.model = T5EncoderModel.from_pretrained(self.folder, local_files_only=True, dtype=self.dtype)
        self.model.to(self.device).eval()

    @property
    def feature_dim(self) -> int:
        return self.model.config.d_model

    def tokenize(self, captions: Sequence[str]) -> dict[str, torch.Tensor]:
        """input_ids and attention_mask [B, max_length] as T5Embedder.get_text_embeddings makes them."""
        if isinstance(captions, str) or not captions:
            raise ValueError("captions must be a non-empty list of strings")
        return self.tokenizer(
            [self.preprocess(caption) for caption in captions],
            max_length=self.max_length,
            padding="max_length",
            truncation=True,
            return_attention_mask=True,
            add_special_tokens=True,
            return_tensors="pt",
        )

    @torch.inference_mode()
    def valid_rows(self, captions: Sequence[str]) -> list[torch.Tensor]:
        """Each caption's valid rows of the T5 output, [n_i, d_model] (what LlamaGen's feature extraction
        saves), in the encoder's dtype, on its device."""
        tokens = self.tokenize(captions)
        ids = tokens["input_ids"].to(self.device)
        attention = tokens["attention_mask"].to(self.device)
        hidden = self.model(input_ids=ids, attention_mask=attention).last_hidden_state
        return [rows[valid.bool()] for rows, valid in zip(hidden, attention, strict=True)]

    def __call__(self, captions: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        return left_pad(self.valid_rows(captions), self.max_length)

    def check_fits(self, config, source: str = "the GPT") -> None:
        """Raise unless a GPTConfig takes this encoder's features: cond_type 't5', caption_dim = d_model and
        cond_len = max_length (a GPT with another prefix length takes captions of that many tokens)."""
        if config.cond_type != "t5":
            raise ValueError(f"{source} takes cond_type {config.cond_type!r}, not T5 caption features")
        if config.caption_dim != self.feature_dim:
            raise ValueError(
                f"{self.folder} gives {self.feature_dim}-d T5 features; {source} takes caption_dim "
                f"{config.caption_dim}"
            )
        if config.cond_len != self.max_length:
            raise ValueError(
                f"{source} has {config.cond_len} condition slots; encode captions with max_length="
                f"{config.cond_len}, not {self.max_length}"
            )


def t5_fingerprint(folder: str | Path) -> str:
    """sha256 of a T5 folder's config and tokenizer files and of its weight files' names and sizes: tells
    features of one encoder from another's without reading gigabytes of weights."""
    folder = Path(folder)
    check_t5_folder(folder)
    digest = hashlib.sha256()
    for path in sorted(folder.iterdir()):
        if path.name in ("config.json", "tokenizer.json", "spiece.model", "tokenizer_config.json"):
            digest.update(path.name.encode() + path.read_bytes())
        elif path.suffix in (".safetensors", ".bin"):
            digest.update(f"{path.name}:{path.stat().st_size}".encode())
    return digest.hexdigest()


def t5_feature_width(folder: str | Path) -> int:
    """d_model of the T5 in `folder`, read from its config.json (no weights loaded): the feature width a
    GPT's caption_dim must equal. Errors name what to put where."""
    folder = Path(folder)
    check_t5_folder(folder)
    config = json.loads((folder / "config.json").read_text())
    if not isinstance(config, dict) or "d_model" not in config:
        raise ValueError(f"{folder / 'config.json'} has no d_model: not a T5 config")
    return int(config["d_model"])


def check_t5_folder(folder: Path) -> None:
    """Raise FileNotFoundError naming what to put where unless `folder` holds a T5 config, tokenizer and
    weights; UnsafePickleError when those weights would not load without running code
    (mulo_sd/nets/safe_files.py)."""
    hint = T5_FILES_HINT.format(folder=folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"T5 folder {folder} not found: {hint}")
    missing = []
    if not (folder / "config.json").is_file():
        missing.append("config.json")
    if not any((folder / name).is_file() for name in ("tokenizer.json", "spiece.model")):
        missing.append("tokenizer.json or spiece.model")
    weights = [*folder.glob("*.safetensors"), *folder.glob("pytorch_model*.bin")]
    if not weights:
        missing.append("model.safetensors (or pytorch_model.bin, or shards with their index)")
    if missing:
        raise FileNotFoundError(f"T5 folder {folder} lacks {', '.join(missing)}: {hint}")
    check_pickled_weights(folder, "T5EncoderModel")
