"""Decoding methods over the AR-model interface (`start`, `step`); one sampler and one stats record."""

from mulo_sd.methods.ar import decode_ar
from mulo_sd.methods.result import DecodeResult
from mulo_sd.methods.zipar import decode_zipar, zipar_target_forwards

__all__ = ["DecodeResult", "decode_ar", "decode_zipar", "zipar_target_forwards"]
