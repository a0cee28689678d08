"""The testbed: SynthScenes (procedurally rendered captioned scenes), the captions' word ids, the evaluation
prompts and SceneEval, the evaluator that checks a caption against an image (docs/testbed.md).

    from mulo_sd.testbed import SceneEval, render_scene
"""

from mulo_sd.testbed.captions import encode_caption
from mulo_sd.testbed.prompts import Prompt, evaluation_prompts
from mulo_sd.testbed.scene_checks import score
from mulo_sd.testbed.sceneeval import SceneEval, frechet_distance, scene_features
from mulo_sd.testbed.synthscenes import render_scene, sample_scene, write_caption

__all__ = [
    "Prompt",
    "SceneEval",
    "encode_caption",
    "evaluation_prompts",
    "frechet_distance",
    "render_scene",
    "sample_scene",
    "scene_features",
    "score",
    "write_caption",
]
