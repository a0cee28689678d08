"""The runtime's entry points: `MuLoPipeline`, a model set loaded once that decodes prompts with any method
(mulo_pipeline.py), over the pieces it joins: model sets loaded by role and checked together (model_set.py;
their files, set_files.py), one decode over every method (decode_entry.py), Tar's two stages (tar_decode.py)
and the testbed's models (testbed_models.py).

    from mulo_sd.pipeline import MuLoPipeline

    pipe = MuLoPipeline.from_pretrained("testbed")  # or a testbed-layout folder, or conf/models/<set>.yaml
    out = pipe(["a red star on a noisy background"], method="mulo", seed=0)
    out.images[0].save("sample.png")

The same decode from the pieces, as the pipeline does it:

    from mulo_sd.decoding import SamplerConfig
    from mulo_sd.pipeline import decode, load_models, tensor_to_pil

    models = load_models(names=["vq", "target", "drafter_r2", "upsampler_r2", "downsampler_r2"])  # testbed
    result = decode("mulo", models, ["a red star on a noisy background"], {}, SamplerConfig(cfg_scale=2.0),
                    seed=0)
    tensor_to_pil(result.image[0]).save("sample.png")

A set of real checkpoints loads with `load_model_set(ModelSet.from_config(...))` (model_set.py).
"""

from mulo_sd.pipeline.decode_entry import (
    METHODS,
    RECOMMENDED,
    decode,
    method_knobs,
    required_models,
    resolve_knobs,
    tensor_to_pil,
)
from mulo_sd.pipeline.folder_hints import train_command
from mulo_sd.pipeline.model_set import Models, ModelSet, load_model_set
from mulo_sd.pipeline.mulo_pipeline import MuLoPipeline, PipelineOutput
from mulo_sd.pipeline.roles import ROLES, TESTBED_DIR
from mulo_sd.pipeline.tar_decode import TarResult, decode_tar
from mulo_sd.pipeline.testbed_models import load_models

__all__ = [
    "METHODS",
    "RECOMMENDED",
    "ROLES",
    "TESTBED_DIR",
    "Models",
    "ModelSet",
    "MuLoPipeline",
    "PipelineOutput",
    "TarResult",
    "decode",
    "decode_tar",
    "load_model_set",
    "load_models",
    "method_knobs",
    "required_models",
    "resolve_knobs",
    "tensor_to_pil",
    "train_command",
]
