"""Decoding over the AR-model interface (`start`, `step`; `step_tree` for EAGLE-2): the methods
(mulo_sd/decoding/methods/), the sampler they share and the statistics record each decode returns.

    from mulo_sd.decoding import SamplerConfig, codebook_neighbours, decode_mulo

`mulo_sd.pipeline.decode` runs them on a model set by name, with the recommended knobs.
"""

from mulo_sd.decoding.methods import (
    DecodeResult,
    decode_ar,
    decode_eagle2,
    decode_lantern,
    decode_mulo,
    decode_zipar,
)
from mulo_sd.decoding.neighbours import codebook_neighbours
from mulo_sd.decoding.sampling import SamplerConfig
from mulo_sd.decoding.stats import DecodeStats

__all__ = [
    "DecodeResult",
    "DecodeStats",
    "SamplerConfig",
    "codebook_neighbours",
    "decode_ar",
    "decode_eagle2",
    "decode_lantern",
    "decode_mulo",
    "decode_zipar",
]
