"""The roles a model set names (mulo_sd/pipeline/model_set.py): one folder each, loaded as the model class of
its role; the text encoder and Tar's first stage (an MLLM folder and a TA-Tok file) are read by their own
loaders, and so are the pixel up-sampler's super-resolution networks (`sr_x2`, `sr_x4`: a state-dict file,
or a folder holding one, that spandrel builds: mulo_sd/nets/sr_network.py)."""

from __future__ import annotations

from pathlib import Path

from mulo_sd.nets.downsampler import Downsampler
from mulo_sd.nets.eagle_head import EagleHead
from mulo_sd.nets.gpt import GPT
from mulo_sd.nets.upsampler import Upsampler
from mulo_sd.nets.vq import VQModel
from mulo_sd.testbed.sceneeval import SceneEval

# the testbed's own set: every role in the subfolder of its name
TESTBED_DIR = Path(__file__).resolve().parents[1] / "assets" / "testbed"

# role -> model class of the folder; the drafters and samplers are kept by these names in `Models`
MODEL_CLASSES = {
    "vq": VQModel,
    "target": GPT,
    "drafter_r2": GPT,
    "drafter_r4": GPT,
    "drafter_small": GPT,
    "eagle_head": EagleHead,
    "upsampler_r2": Upsampler,
    "upsampler_r4": Upsampler,
    "downsampler_r2": Downsampler,
    "downsampler_r4": Downsampler,
    "sceneeval": SceneEval,
}
TEXT_ENCODER = "text_encoder"
MLLM, TATOK = "mllm", "tatok"  # Tar's first stage: a folder and a file
SR_NETWORKS = {2: "sr_x2", 4: "sr_x4"}  # r -> role of the pixel up-sampler's network (knobs.pixel_mode=sr)
ROLES = (*MODEL_CLASSES, TEXT_ENCODER, MLLM, TATOK, *SR_NETWORKS.values())
DRAFTERS = ("drafter_r2", "drafter_r4", "drafter_small")
SAMPLERS = ("upsampler_r2", "upsampler_r4", "downsampler_r2", "downsampler_r4")
GPT_ROLES = ("target", *DRAFTERS)
SCALES = {"drafter_r2": 2, "drafter_r4": 4, "drafter_small": 1, **{name: int(name[-1]) for name in SAMPLERS}}
FAMILIES = ("testbed", "llamagen", "tar")
