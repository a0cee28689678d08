"""The config fields of an official checkpoint (official.py): what the file's stored training settings, the
caller's settings and the weights' shapes say, in that order of authority.

- The file's own settings (LlamaGen's pickled `args`; Tar's spec `args` and model name) are authoritative:
  a caller value that disagrees is an error naming both.
- Caller settings (`mulo-convert` flags, `gpt_from_official(**settings)`) fill in what the file does not
  store.
- Shapes give what the weights fix exactly: depth, width, vocabulary, caption width, codebook, channels.
- What none of these gives is LlamaGen's own default (`--cls-token-num 120`, `--downsample-size 16`,
  `--num-classes 1000`) or an error naming the flag to pass.

Each value keeps its origin, which `mulo-convert` prints. The returned fields are keyword arguments of
`GPTConfig` (this module) / `VQConfig` (official_vq_config.py); official_models.py builds the models.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

import torch

from mulo_sd.llamagen.official import OfficialCheckpoint, OfficialCheckpointError

# (n_layer, n_head, dim) of LlamaGen's GPT_models (autoregressive/models/gpt.py) and Tar's llama-abs models
LLAMAGEN_GPT_SIZES = {
    "GPT-B": (12, 12, 768),
    "GPT-L": (24, 16, 1024),
    "GPT-XL": (36, 20, 1280),
    "GPT-XXL": (48, 24, 1536),
    "GPT-XXXL": (48, 40, 2560),
    "GPT-1B": (22, 32, 2048),
    "GPT-3B": (24, 32, 3200),
    "GPT-7B": (32, 32, 4096),
}
TAR_GPT_SIZES = {
    "llama-abs-S": (12, 6, 384),
    "llama-abs-B": (12, 12, 768),
    "llama-abs-L": (24, 16, 1024),
    "llama-abs-LP": (30, 20, 1280),
    "llama-abs-XL": (36, 20, 1280),
    "llama-abs-XXL": (48, 24, 1536),
    "llama-abs-XXXL": (48, 40, 2560),
}
# Settings a caller may pass per family (`mulo-convert` flags with '-' for '_')
GPT_SETTINGS = {
    "llamagen-gpt": ("model_size", "image_size", "downsample_size", "cls_token_num", "num_classes", "n_head"),
    "tar-ar-dtok": ("model_size", "cls_token_num", "max_seq_len", "cond_len", "n_head"),
}
LLAMAGEN_CLS_TOKEN_NUM = 120  # --cls-token-num default of LlamaGen's t2i train and sample scripts
LLAMAGEN_DOWNSAMPLE = 16
LLAMAGEN_NUM_CLASSES = 1000
LLAMAGEN_CLASS_DROPOUT = 0.1  # ModelArgs.class_dropout_prob


@dataclass
class ConfigFields:
    """Config keyword arguments and, per field, where its value came from."""

    values: dict[str, Any] = field(default_factory=dict)
    origins: dict[str, str] = field(default_factory=dict)

    def set(self, name: str, value, origin: str) -> None:
        self.values[name] = value
        self.origins[name] = origin

    def describe(self) -> str:
        return "\n".join(
            f"  {name} = {value!r}  ({self.origins[name]})" for name, value in self.values.items()
        )


def gpt_fields(checkpoint: OfficialCheckpoint, state: dict[str, torch.Tensor], **given) -> ConfigFields:
    """GPTConfig fields of a LlamaGen or Tar GPT file; `given`: the settings of GPT_SETTINGS[family]."""
    checkpoint.expect("llamagen-gpt", "tar-ar-dtok")
    known = GPT_SETTINGS[checkpoint.family]
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise TypeError(f"unknown setting(s) {unknown} for {checkpoint.family}; known: {list(known)}")
    given = {k: v for k, v in given.items() if v is not None}
    if checkpoint.family == "llamagen-gpt":
        return _llamagen_gpt(checkpoint, state, given)
    return _tar_gpt(checkpoint, state, given)


def check_gpt_config(config, checkpoint: OfficialCheckpoint) -> None:
    """Raise unless a given GPTConfig agrees with every setting the file stores."""
    stored = _stored_gpt_fields(checkpoint)
    wrong = [
        f"{name} is {getattr(config, name)!r}, {origin} gives {value!r}"
        for name, (value, origin) in stored.items()
        if getattr(config, name) != value
    ]
    if wrong:
        raise OfficialCheckpointError(
            f"{checkpoint.path}: the config disagrees with the settings stored in the file: "
            + "; ".join(wrong)
        )


# ---- LlamaGen GPT -----------------------------------------------------------------------------------


def _llamagen_gpt(checkpoint: OfficialCheckpoint, state, given) -> ConfigFields:
    path, out = checkpoint.path, ConfigFields()
    _depth_and_width(state, path, out)
    t2i = _llamagen_condition(checkpoint, state, out)
    name = _size_name(checkpoint.settings.get("gpt_model"), LLAMAGEN_GPT_SIZES, "GPT-")
    _heads(checkpoint, state, given, out, LLAMAGEN_GPT_SIZES, "GPT-", (name, "checkpoint args.gpt_model"))
    _llamagen_grid(checkpoint, given, out)
    out.set("position", "rope2d", "LlamaGen")
    if t2i:
        _llamagen_caption_prefix(checkpoint, state, given, out)
    else:
        _llamagen_class_prefix(checkpoint, state, given, out)
    return out


def _llamagen_condition(checkpoint: OfficialCheckpoint, state, out: ConfigFields) -> bool:
    """cond_type from the weights: 't5' for t2i's caption projection, 'class' for c2i's table; True: t2i."""
    t2i = "cls_embedding.cap_proj.fc1.weight" in state
    gpt_type = checkpoint.settings.get("gpt_type")
    if gpt_type is not None and gpt_type != ("t2i" if t2i else "c2i"):
        raise OfficialCheckpointError(
            f"{checkpoint.path}: args.gpt_type is {gpt_type!r} but the weights have a "
            f"{'caption projection (t2i)' if t2i else 'class table (c2i)'}"
        )
    condition = "cls_embedding.cap_proj" if t2i else "cls_embedding.embedding_table"
    out.set("cond_type", "t5" if t2i else "class", f"weights: {condition}")
    return t2i


def _llamagen_grid(checkpoint: OfficialCheckpoint, given, out: ConfigFields) -> None:
    """grid_size: the image size it was trained at over the VQ downsampling factor."""
    path = checkpoint.path
    image_size, origin = _pick(checkpoint, "image_size", given)
    if image_size is None:
        raise OfficialCheckpointError(
            f"{path} stores no training args: pass the image size it was trained at with --image-size "
            f"(image_size=), e.g. 256 for t2i_XL_stage1_256.pt, 512 for t2i_XL_stage2_512.pt"
        )
    factor, factor_origin = _pick(checkpoint, "downsample_size", given)
    if factor is None:
        factor, factor_origin = (
            LLAMAGEN_DOWNSAMPLE,
            f"LlamaGen's default --downsample-size {LLAMAGEN_DOWNSAMPLE}",
        )
    if image_size % factor:
        raise OfficialCheckpointError(f"{path}: image size {image_size} is not a multiple of {factor}")
    out.set("grid_size", (image_size // factor,) * 2, f"{origin} / {factor_origin}")


def _llamagen_caption_prefix(checkpoint: OfficialCheckpoint, state, given, out: ConfigFields) -> None:
    """t2i: caption_dim from the caption projection; cond_len (cls_token_num), within uncond_embedding."""
    path = checkpoint.path
    out.set(
        "caption_dim",
        tensor_shape(state, "cls_embedding.cap_proj.fc1.weight", path)[1],
        "weights: cls_embedding.cap_proj",
    )
    cond_len, origin = _pick(checkpoint, "cls_token_num", given)
    if cond_len is None:
        cond_len, origin = (
            LLAMAGEN_CLS_TOKEN_NUM,
            f"LlamaGen's default --cls-token-num {LLAMAGEN_CLS_TOKEN_NUM}",
        )
    rows = tensor_shape(state, "cls_embedding.uncond_embedding", path)[0]
    if cond_len > rows:
        raise OfficialCheckpointError(
            f"{path}: cls_token_num {cond_len} ({origin}) exceeds the {rows} rows of uncond_embedding"
        )
    out.set("cond_len", cond_len, origin)


def _llamagen_class_prefix(checkpoint: OfficialCheckpoint, state, given, out: ConfigFields) -> None:
    """c2i: one condition slot, num_classes and, given a null-class row, the class dropout it trained with."""
    path = checkpoint.path
    out.set("cond_len", 1, "LlamaGen c2i")
    classes, origin = _pick(checkpoint, "num_classes", given)
    if classes is None:
        classes, origin = LLAMAGEN_NUM_CLASSES, f"LlamaGen's default --num-classes {LLAMAGEN_NUM_CLASSES}"
    rows = tensor_shape(state, "cls_embedding.embedding_table.weight", path)[0]
    if rows not in (classes, classes + 1):
        raise OfficialCheckpointError(
            f"{path}: the class table has {rows} rows, not num_classes {classes} ({origin}) or one more"
        )
    out.set("num_classes", classes, origin)
    dropout = checkpoint.settings.get("class_dropout_prob", LLAMAGEN_CLASS_DROPOUT) if rows > classes else 0.0
    out.set("class_dropout_prob", dropout, "weights: a null-class row" if rows > classes else "no null row")


# ---- Tar AR-DTok ------------------------------------------------------------------------------------


def _tar_gpt(checkpoint: OfficialCheckpoint, state, given) -> ConfigFields:
    path, out = checkpoint.path, ConfigFields()
    model_type = checkpoint.settings.get("model_type")
    if model_type not in (None, "clip_cond"):
        raise OfficialCheckpointError(
            f"{path}: model_type {model_type!r}; only Tar's 'clip_cond' (TA-Tok feature prefix) is supported"
        )
    _depth_and_width(state, path, out)
    name = _size_name(checkpoint.model_name, TAR_GPT_SIZES, "llama-abs-")
    _heads(checkpoint, state, given, out, TAR_GPT_SIZES, "llama-abs-", (name, "checkpoint spec name"))
    out.set("cond_type", "tatok", "weights: clip_proj")
    out.set("position", "absolute", "weights: abs_pe")
    caption_dim = tensor_shape(state, "clip_proj.weight", path)[1]
    stored_dim = checkpoint.settings.get("cond_dim")
    if stored_dim is not None and stored_dim != caption_dim:
        raise OfficialCheckpointError(
            f"{path}: args.cond_dim is {stored_dim} but clip_proj takes {caption_dim}"
        )
    out.set("caption_dim", caption_dim, "weights: clip_proj.weight")
    rows = tensor_shape(state, "abs_pe", path)[1]
    trained, trained_origin = _pick(checkpoint, "cls_token_num", given)
    tokens, tokens_origin = _pick(checkpoint, "max_seq_len", given)
    if trained is None and tokens is None:
        raise OfficialCheckpointError(
            f"{path} stores neither cls_token_num nor max_seq_len: pass --cls-token-num (the prefix length "
            f"it was trained with, e.g. 729) or --max-seq-len (its image tokens); abs_pe has {rows} = "
            f"max_seq_len + cls_token_num - 1 rows"
        )
    if tokens is None:
        tokens, tokens_origin = rows + 1 - trained, "abs_pe rows - cls_token_num + 1"
    if trained is None:
        trained, trained_origin = rows + 1 - tokens, "abs_pe rows - max_seq_len + 1"
    side = math.isqrt(max(tokens, 0))
    if side * side != tokens or rows != tokens + trained - 1:
        raise OfficialCheckpointError(
            f"{path}: max_seq_len {tokens} ({tokens_origin}) and cls_token_num {trained} "
            f"({trained_origin}) do not fit abs_pe's {rows} rows (max_seq_len + cls_token_num - 1) on a "
            f"square grid"
        )
    out.set("grid_size", (side, side), tokens_origin)
    out.set("n_positions", rows, "weights: abs_pe")
    if "cond_len" in given:  # another TA-Tok scale than the one it was trained with
        out.set("cond_len", given["cond_len"], "--cond-len")
    else:
        out.set("cond_len", trained, trained_origin)
    return out


# ---- shared -------------------------------------------------------------------------------------------


def _stored_gpt_fields(checkpoint: OfficialCheckpoint) -> dict[str, tuple[Any, str]]:
    """{GPTConfig field (or property): (value, origin)} fixed by the settings stored in the file alone."""
    settings, found = checkpoint.settings, {}
    if checkpoint.family == "llamagen-gpt":
        name, table, label = settings.get("gpt_model"), LLAMAGEN_GPT_SIZES, "checkpoint args.gpt_model"
        name = _size_name(name, table, "GPT-")
        if settings.get("gpt_type") in ("t2i", "c2i"):
            found["cond_type"] = (
                {"t2i": "t5", "c2i": "class"}[settings["gpt_type"]],
                "checkpoint args.gpt_type",
            )
        if settings.get("cls_token_num") is not None and settings.get("gpt_type", "t2i") == "t2i":
            found["cond_len"] = (settings["cls_token_num"], "checkpoint args.cls_token_num")
        if settings.get("image_size") and settings.get("downsample_size"):
            grid = settings["image_size"] // settings["downsample_size"]
            found["grid_size"] = ((grid, grid), "checkpoint args.image_size / args.downsample_size")
        if settings.get("gpt_type") == "c2i" and settings.get("num_classes") is not None:
            found["num_classes"] = (settings["num_classes"], "checkpoint args.num_classes")
    else:
        name, table, label = checkpoint.model_name, TAR_GPT_SIZES, "checkpoint spec name"
        name = _size_name(name, table, "llama-abs-")
        tokens, trained = settings.get("max_seq_len"), settings.get("cls_token_num")
        if tokens is not None:
            found["num_tokens"] = (tokens, "checkpoint args.max_seq_len")
            if trained is not None:
                found["n_positions"] = (
                    tokens + trained - 1,
                    "checkpoint args.max_seq_len + cls_token_num - 1",
                )
        if settings.get("cond_dim") is not None:
            found["caption_dim"] = (settings["cond_dim"], "checkpoint args.cond_dim")
    if settings.get("vocab_size") is not None:
        found["vocab_size"] = (settings["vocab_size"], "checkpoint args.vocab_size")
    if name in table:
        for field_name, value in zip(("n_layer", "n_head", "dim"), table[name], strict=True):
            found[field_name] = (value, f"{label} {name!r}")
    return found


def _pick(checkpoint: OfficialCheckpoint, name: str, given: dict) -> tuple[Any, str | None]:
    """(value, origin) of one setting: the file's, else the caller's; both given must agree."""
    stored, wanted = checkpoint.settings.get(name), given.get(name)
    if stored is not None:
        if wanted is not None and wanted != stored:
            raise OfficialCheckpointError(
                f"{checkpoint.path}: --{name.replace('_', '-')} {wanted} disagrees with the file's own "
                f"training setting args.{name} = {stored!r}"
            )
        return stored, f"checkpoint args.{name}"
    if wanted is not None:
        return wanted, f"--{name.replace('_', '-')}"
    return None, None


def _heads(checkpoint, state, given, out: ConfigFields, table, prefix, stored) -> None:
    """n_head (and n_kv_head from the fused qkv projection): from the model size's table row, else
    --n-head, else the one table row with the weights' depth and width."""
    path, n_layer, dim = checkpoint.path, out.values["n_layer"], out.values["dim"]
    name, origin = stored
    wanted = _size_name(given.get("model_size"), table, prefix)
    if name is not None and wanted is not None and wanted != name:
        raise OfficialCheckpointError(f"{path}: --model-size {wanted} disagrees with {origin} {name!r}")
    if name is None and wanted is not None:
        name, origin = wanted, "--model-size"
    n_head = given.get("n_head")
    if name is not None:
        if name not in table and n_head is None:
            raise OfficialCheckpointError(
                f"{path}: model size {name!r} ({origin}) is not one of {list(table)}: pass --n-head"
            )
        if name in table:
            layers, heads, width = table[name]
            if (layers, width) != (n_layer, dim):
                raise OfficialCheckpointError(
                    f"{path}: {origin} {name!r} has {layers} layers of width {width}; the weights have "
                    f"{n_layer} of width {dim}"
                )
            if n_head is not None and n_head != heads:
                raise OfficialCheckpointError(
                    f"{path}: --n-head {n_head} disagrees with {name}'s {heads} heads"
                )
            n_head, origin = heads, f"{origin} {name!r}"
        else:
            origin = "--n-head"
    elif n_head is not None:
        origin = "--n-head"
    else:
        matches = [size for size, (layers, _, width) in table.items() if (layers, width) == (n_layer, dim)]
        if len(matches) != 1:
            raise OfficialCheckpointError(
                f"{path} stores no model size and {n_layer} layers of width {dim} match no size of "
                f"{list(table)}: pass --model-size or --n-head"
            )
        n_head, origin = table[matches[0]][1], f"size {matches[0]} (its depth and width match the weights)"
    if dim % n_head:
        raise OfficialCheckpointError(f"{path}: width {dim} is not divisible by {n_head} heads ({origin})")
    out.set("n_head", n_head, origin)
    fused = tensor_shape(state, "layers.0.attention.wqkv.weight", path)[0] // (dim // n_head)
    kv_heads = (fused - n_head) // 2
    out.set("n_kv_head", None if kv_heads == n_head else kv_heads, "weights: layers.0.attention.wqkv.weight")


def _depth_and_width(state, path, out: ConfigFields) -> None:
    vocab, dim = tensor_shape(state, "tok_embeddings.weight", path)
    n_layer = count_indexed(state, r"layers\.(\d+)\.")
    out.set("vocab_size", vocab, "weights: tok_embeddings.weight")
    out.set("dim", dim, "weights: tok_embeddings.weight")
    out.set("n_layer", n_layer, "weights: layers.*")


def _size_name(name, table: dict, prefix: str):
    """'XL', 'gpt-xl' or 'GPT-XL' -> 'GPT-XL' (names outside the table are returned as given)."""
    if name is None:
        return None
    by_lower = {key.lower(): key for key in table}
    name = str(name)
    return by_lower.get(name.lower()) or by_lower.get((prefix + name).lower()) or name


def tensor_shape(state, key: str, path) -> tuple[int, ...]:
    """The shape of state[key]; a missing tensor is an error naming it and the file."""
    if key not in state:
        raise OfficialCheckpointError(f"{path}: tensor {key!r} is missing from the weights")
    return tuple(state[key].shape)


def count_indexed(state, pattern: str) -> int:
    """1 + the largest index captured by `pattern` among the keys (0 when none matches)."""
    found = [int(m.group(1)) for key in state if (m := re.match(pattern, key))]
    return max(found) + 1 if found else 0
