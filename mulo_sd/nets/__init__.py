"""The networks layer: the runtime's models and their configs, each saved and loaded as a folder
(`Pretrained`: config.json + model.safetensors). Official LlamaGen / Tar AR-DTok files load through
mulo_sd.llamagen. hf_adapter.py imports transformers, so it is left out here: import it by its module."""

from mulo_sd.nets.downsampler import Downsampler, DownsamplerConfig
from mulo_sd.nets.eagle_head import EagleHead, EagleHeadConfig
from mulo_sd.nets.gpt import GPT
from mulo_sd.nets.gpt_config import GPTConfig
from mulo_sd.nets.io import ModelFileError, Pretrained
from mulo_sd.nets.pixel_samplers import PixelDownsampler, PixelUpsampler
from mulo_sd.nets.slot_cache import DecodeState
from mulo_sd.nets.upsampler import Upsampler, UpsamplerConfig
from mulo_sd.nets.vq import VQModel
from mulo_sd.nets.vq_config import VQConfig

__all__ = [
    "DecodeState",
    "Downsampler",
    "DownsamplerConfig",
    "EagleHead",
    "EagleHeadConfig",
    "GPT",
    "GPTConfig",
    "ModelFileError",
    "PixelDownsampler",
    "PixelUpsampler",
    "Pretrained",
    "Upsampler",
    "UpsamplerConfig",
    "VQConfig",
    "VQModel",
]
