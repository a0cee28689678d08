"""Models built from the checkpoint files LlamaGen and Tar AR-DTok release or train: the file is read
safely (official.py), the config taken from it (official_configs.py, official_vq_config.py), and the weights
loaded only when every name and shape matches the model built from that config.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn as nn

from mulo_sd.llamagen.official import OfficialCheckpoint, read_official
from mulo_sd.llamagen.official_configs import check_gpt_config, gpt_fields
from mulo_sd.llamagen.official_vq_config import vq_fields
from mulo_sd.nets.gpt import GPT
from mulo_sd.nets.gpt_config import GPTConfig
from mulo_sd.nets.vq import VQModel
from mulo_sd.nets.vq_config import VQConfig

OFFICIAL_GPT_SOURCES = (
    "download the official checkpoint and pass its local path (LlamaGen t2i: t2i_XL_stage1_256.pt / "
    "t2i_XL_stage2_512.pt from huggingface.co/peizesun/llamagen_t2i; Tar AR-DTok: "
    "ar_dtok_lp_{256,512,1024}px.pth from huggingface.co/csuhan/TA-Tok)"
)
OFFICIAL_VQ_SOURCES = (
    "download LlamaGen's VQ checkpoint (vq_ds16_t2i.pt from the LlamaGen release) and pass its path; "
    "nothing is downloaded at run time"
)
LISTED = 10  # keys named per kind of mismatch


def gpt_from_official(
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
    checkpoint = _checkpoint(path, trust_pickle, OFFICIAL_GPT_SOURCES)
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
            raise ValueError(
                f"{checkpoint.path}: {uncond} has {rows} rows, fewer than cond_len {config.cond_len}"
            )
        state[uncond] = state[uncond][: config.cond_len]
    return _load_weights(GPT(config), state, checkpoint.path, device)


def vq_from_official(
    path: str | Path | OfficialCheckpoint,
    device: str | torch.device = "cpu",
    *,
    weights: str = "model",
    trust_pickle: bool = False,
    **config_overrides,
) -> VQModel:
    """Load a LlamaGen VQ file (`{"model": state_dict, ...}`, e.g. vq_ds16_t2i.pt, or a training
    checkpoint with its "ema" weights and `args`), by path or as an `OfficialCheckpoint` already read.
    File reading, safe unpickling and `trust_pickle`: mulo_sd/llamagen/official.py.

    The config comes from the file (official_vq_config.vq_fields): the architecture from the weights'
    shapes, the quantiser's settings from its stored training args, then `config_overrides` (VQConfig
    fields, e.g. norm_groups). weights: "model" (what LlamaGen's sample scripts load) or "ema".
    Save the result with `save_pretrained`."""
    checkpoint = _checkpoint(path, trust_pickle, OFFICIAL_VQ_SOURCES)
    checkpoint.expect("llamagen-vq")
    state = checkpoint.weights(weights)
    config = VQConfig(**vq_fields(checkpoint, state, **config_overrides).values)
    hint = "pass config overrides (codebook_size, codebook_embed_dim, ch_mult ...) that match the checkpoint"
    return _load_weights(VQModel(config), state, checkpoint.path, device, hint)


def _checkpoint(
    path: str | Path | OfficialCheckpoint, trust_pickle: bool, sources: str
) -> OfficialCheckpoint:
    if isinstance(path, OfficialCheckpoint):  # already read (mulo-convert reads it once)
        return path
    return read_official(path, trust_pickle=trust_pickle, missing_hint=sources)


def _load_weights(
    model: nn.Module, state: dict[str, torch.Tensor], path: Path, device, hint: str = ""
) -> nn.Module:
    """`model` with the file's weights, in eval mode on `device`; the file's key names and shapes must be
    exactly the model's, else the error lists the missing, unexpected and mismatched tensors."""
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
            f"{path} does not match {type(model).__name__}({model.config}):\n"
            f"  missing ({len(missing)}): {missing[:LISTED]}\n"
            f"  unexpected ({len(unexpected)}): {unexpected[:LISTED]}\n"
            f"  shape mismatches ({len(mismatched)}): {mismatched[:LISTED]}" + (f"\n{hint}" if hint else "")
        )
    model.load_state_dict(state, strict=True)
    return model.to(device).eval()
