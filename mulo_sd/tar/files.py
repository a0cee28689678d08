"""Tar's first-stage files, checked before any weights load (mulo_sd/pipeline/model_set.py): the MLLM folder
(a
Qwen2-family transformers causal LM, as Tar-1.5B and Tar-7B are) and the TA-Tok checkpoint file, whose
feature width the AR-DTok's clip projection must take and whose code counts per scale one of the AR-DTok's
prefix length must be (docs/tar.md).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from mulo_sd.nets.safe_files import check_pickled_weights, load_torch_file

MLLM_TYPES = ("qwen2",)  # config.json model_type of Tar-1.5B / Tar-7B (Qwen2.5 checkpoints)
SCALES = 3  # Tar's scale tokens <S0>, <S1>, <S2>: 729, 169, 81 codes for its 27 x 27 grid
FEATURE_KEY = "decode_task_layer.2.weight"
GRID_KEY = "encoder.embeddings.position_embedding.weight"
TAR_FILES_HINT = {
    "mllm": "put csuhan/Tar-1.5B's files (config.json, tokenizer files, model.safetensors) in {path}",
    "tatok": "download ta_tok.pth from huggingface.co/csuhan/TA-Tok to {path}",
}


def check_mllm_folder(folder: str | Path) -> None:
    """Raise unless `folder` holds the config.json of a Qwen2-family causal LM, naming the file and field,
    and weights that load without running code (mulo_sd/nets/safe_files.py)."""
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: {TAR_FILES_HINT['mllm'].format(path=folder)}")
    try:
        config = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path} is not a readable JSON config ({error})") from None
    model_type = config.get("model_type") if isinstance(config, dict) else None
    if model_type not in MLLM_TYPES:
        raise ValueError(
            f"{path}: model_type is {model_type!r}, but Tar's MLLM is a Qwen2-family causal LM "
            f"(model_type one of {list(MLLM_TYPES)}): is this the folder of another model?"
        )
    check_pickled_weights(folder, "Qwen2ForCausalLM")


@dataclass
class TATokShape:
    feature_dim: int  # width of the features the codes stand for (the AR-DTok's clip_proj input)
    token_counts: tuple[int, ...]  # codes per image at Tar's scales <S0>, <S1>, <S2>


def read_tatok_shape(path: str | Path) -> TATokShape:
    """The TA-Tok file's feature width and token counts, read from its tensor shapes (memory-mapped: no
    tensor data is read). Tar's file is `{"model": {"args", "sd"}}` (mulo_sd/tar/tatok.py); the features leave
    the decoder's last projection `decode_task_layer.2`; the SigLIP2 encoder's position table is the square
    code grid at <S0>, which scale k average-pools by k + 1 (Tar's tok/ta_tok.py, `avg_pool`)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"TA-Tok file {path} not found: {TAR_FILES_HINT['tatok'].format(path=path)}")
    checkpoint = load_torch_file(path, mmap=True)  # raises naming the file: unreadable, or not plain tensors
    spec = checkpoint.get("model") if isinstance(checkpoint, dict) else None
    state = spec.get("sd") if isinstance(spec, dict) else None
    if not isinstance(state, dict):
        keys = sorted(checkpoint) if isinstance(checkpoint, dict) else type(checkpoint).__name__
        raise ValueError(f"{path} is not a TA-Tok file: Tar's is {{'model': {{'sd': ...}}}}, it holds {keys}")
    missing = [key for key in (FEATURE_KEY, GRID_KEY) if key not in state]
    if missing:
        raise ValueError(f"{path} has no {missing} (a TA-Tok file has both); its keys: {sorted(state)[:12]}")
    side = math.isqrt(state[GRID_KEY].shape[0])
    counts = tuple((side // (scale + 1)) ** 2 for scale in range(SCALES))
    return TATokShape(int(state[FEATURE_KEY].shape[0]), counts)
