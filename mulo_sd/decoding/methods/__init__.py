"""Decoding methods over the AR-model interface (`start`, `step`; `step_tree` for eagle2); one sampler and one
stats record."""

from mulo_sd.decoding.methods.ar import decode_ar
from mulo_sd.decoding.methods.eagle2 import decode_eagle2
from mulo_sd.decoding.methods.lantern import decode_lantern
from mulo_sd.decoding.methods.mulo import decode_mulo
from mulo_sd.decoding.methods.result import DecodeResult
from mulo_sd.decoding.methods.zipar import decode_zipar, zipar_target_forwards

__all__ = [
    "DecodeResult",
    "decode_ar",
    "decode_eagle2",
    "decode_lantern",
    "decode_mulo",
    "decode_zipar",
    "zipar_target_forwards",
]
