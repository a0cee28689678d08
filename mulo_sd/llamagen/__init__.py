"""LlamaGen text-to-image: the official checkpoint files (read safely, converted by `mulo-convert`) and the
FLAN-T5 caption encoder with LlamaGen's conventions. transformers is imported only when a T5 encoder loads."""

from mulo_sd.llamagen.official import OfficialCheckpoint, OfficialCheckpointError, read_official
from mulo_sd.llamagen.official_models import gpt_from_official, vq_from_official
from mulo_sd.llamagen.t5 import T5TextEncoder, left_pad

__all__ = [
    "OfficialCheckpoint",
    "OfficialCheckpointError",
    "T5TextEncoder",
    "gpt_from_official",
    "left_pad",
    "read_official",
    "vq_from_official",
]
