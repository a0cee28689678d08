"""The condition a frozen target GPT gets for a training batch's captions (the up-sampler's acceptance
metric): caption word ids for the testbed's word-conditioned targets, T5 features and their mask for
LlamaGen's t2i targets. T5 features come from the batch when the shards store them
(`data.caption_features: t5`, written by `mulo-data pretokenize --text-encoder`), else from a FLAN-T5 folder
run on the captions; both give the same features (mulo_sd/llamagen/t5.py: `left_pad` of the stored rows
equals the
encoder's output). Tar's AR-DTok targets take each image's TA-Tok features, which only the shards can hold
(`data.caption_features: tatok`, `tatok.npy` [cond_len, caption_dim]: docs/tar.md).
"""

from __future__ import annotations

from pathlib import Path

import torch
from mulo_sd.training.ar_module import check_word_condition

from mulo_sd.llamagen.t5 import FEATURES_MEMBER, T5TextEncoder, left_pad, t5_feature_width
from mulo_sd.nets.dtypes import resolve_dtype
from mulo_sd.nets.gpt_config import GPTConfig
from mulo_sd.testbed.captions import MAX_CAPTION_WORDS, encode_caption

FEATURES_KEY = FEATURES_MEMBER.removesuffix(".npy")  # the batch key of stored T5 rows
TATOK_KEY = "tatok"  # the batch key of stored TA-Tok features (member tatok.npy)


class CaptionCondition:
    """`condition(batch, device)` -> (cond, cond_mask or None) for a GPT of `config`. `text_encoder`: a T5
    folder for batches without stored features (checked against the GPT's caption_dim here, before any
    compute); `text_dtype` its dtype."""

    def __init__(
        self, config: GPTConfig, text_encoder: str | Path | None = None, text_dtype: str = "float32"
    ):
        self.config = config
        self.folder = None if text_encoder is None else Path(text_encoder)
        self.dtype = resolve_dtype(text_dtype)
        self.encoder: T5TextEncoder | None = None  # loaded on first use, on the batch's device
        if config.cond_type == "words":
            check_word_condition(config)
        elif config.cond_type == "tatok":
            if self.folder is not None:
                raise ValueError(
                    f"the target takes TA-Tok features, which come from the shards ({TATOK_KEY}.npy), not "
                    f"from a T5 folder: set model.acceptance.text_encoder=null"
                )
        elif config.cond_type != "t5":
            raise ValueError(
                f"the target must take caption word ids, T5 or TA-Tok features, not '{config.cond_type}'"
            )
        elif self.folder is not None and t5_feature_width(self.folder) != config.caption_dim:
            raise ValueError(
                f"{self.folder} gives {t5_feature_width(self.folder)}-d T5 features, but the target takes "
                f"caption_dim {config.caption_dim}: use the T5 the target was trained with"
            )

    def __call__(self, batch: dict, device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
        config = self.config
        if config.cond_type == "words":
            words = torch.stack([encode_caption(text, MAX_CAPTION_WORDS) for text in batch["caption"]])
            return words.to(device), None
        if config.cond_type == "tatok":
            return self.tatok(batch, device), None
        if FEATURES_KEY in batch:
            rows = batch[FEATURES_KEY]
            longest = max(r.shape[0] for r in rows)
            if longest > config.cond_len or rows[0].shape[-1] != config.caption_dim:
                raise ValueError(
                    f"the batch's {FEATURES_MEMBER} rows are up to {longest} x {rows[0].shape[-1]}, but the "
                    f"target takes {config.cond_len} x {config.caption_dim}: pre-tokenise with "
                    f"--text-max-length {config.cond_len} and the T5 it was trained with"
                )
            return left_pad([r.to(device) for r in rows], config.cond_len)
        if self.folder is None:
            raise ValueError(
                f"the target takes T5 caption features, but the batch has no '{FEATURES_KEY}' rows "
                f"(data.caption_features: {FEATURES_KEY}, from mulo-data pretokenize --text-encoder) and no "
                f"T5 folder is set (model.acceptance.text_encoder)"
            )
        if self.encoder is None:
            self.encoder = T5TextEncoder(self.folder, device, self.dtype, max_length=config.cond_len)
        features, mask = self.encoder(batch["caption"])
        return features.to(device), mask.to(device)

    def tatok(self, batch: dict, device: torch.device) -> torch.Tensor:
        """The batch's stored TA-Tok features [B, cond_len, caption_dim]."""
        config = self.config
        if TATOK_KEY not in batch:
            raise ValueError(
                f"the target takes TA-Tok features, but the batch has no '{TATOK_KEY}' rows: shards with a "
                f"{TATOK_KEY}.npy member per image and data.caption_features={TATOK_KEY} (docs/tar.md)"
            )
        rows = batch[TATOK_KEY]
        wanted = (config.cond_len, config.caption_dim)
        wrong = sorted({tuple(r.shape) for r in rows if tuple(r.shape) != wanted})
        if wrong:
            raise ValueError(
                f"the batch's {TATOK_KEY}.npy rows have shapes {wrong}, but the target takes {list(wanted)} "
                f"(cond_len x caption_dim): store the features of the TA-Tok scale it was converted for"
            )
        return torch.stack(rows).to(device)
