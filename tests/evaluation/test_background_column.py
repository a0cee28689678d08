"""SceneEval's background check reaches the evaluation rows and summaries beside the prompt score."""

import torch

from mulo_sd.evaluation.quality import sceneeval_rows
from mulo_sd.evaluation.summaries import sceneeval_summary
from mulo_sd.testbed.sceneeval import SceneEval, SceneEvalConfig
from mulo_sd.testbed.synthscenes import BACKGROUNDS
from tests.testbed.test_sceneeval import TINY_NET

CAPTIONS = ["a red circle on a striped background", "two blue stars on a noisy background"]


def test_background_is_scored_beside_the_prompt_score_when_the_scorer_has_a_head():
    torch.manual_seed(0)
    with_head = SceneEval(SceneEvalConfig(**TINY_NET, background_channels=8)).eval()
    without = SceneEval(SceneEvalConfig(**TINY_NET)).eval()
    without.load_state_dict(with_head.state_dict(), strict=False)
    images = torch.rand(2, 3, 32, 32) * 2 - 1
    rows, plain = sceneeval_rows(with_head, images, CAPTIONS), sceneeval_rows(without, images, CAPTIONS)
    predicted = [BACKGROUNDS[i] for i in with_head.predict_background(images).tolist()]
    expected = [float(kind == caption.split()[-2]) for kind, caption in zip(predicted, CAPTIONS, strict=True)]
    assert [row["sceneeval_background"] for row in rows] == expected
    assert [row["sceneeval"] for row in rows] == [row["sceneeval"] for row in plain]  # not in the score
    assert all("sceneeval_background" not in row for row in plain)
    assert sceneeval_summary(rows)["sceneeval_background"] == sum(expected) / 2
    assert sceneeval_summary(plain)["sceneeval_background"] is None
