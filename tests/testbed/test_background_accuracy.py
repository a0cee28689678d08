"""`python -m mulo_sd.testbed.background_accuracy`: held-out background accuracy per kind, as a table."""

import torch

from mulo_sd.testbed.background_accuracy import accuracy_table, main, read_backgrounds
from mulo_sd.testbed.sceneeval import SceneEval, SceneEvalConfig
from mulo_sd.testbed.synthscenes import BACKGROUNDS, render_scene
from tests.helpers import tiny_vq


def test_table_counts_each_kind_and_all():
    truth = torch.tensor([0, 0, 1, 1, 1, 2])
    real = torch.tensor([0, 1, 1, 1, 1, 2])
    round_trip = torch.tensor([0, 0, 0, 0, 1, 3])
    assert accuracy_table(truth, real, round_trip).splitlines() == [
        "| background | scenes | real | VQ round trip |",
        "|---|---|---|---|",
        "| gradient | 2 | 50.0% | 100.0% |",
        "| striped | 3 | 100.0% | 33.3% |",
        "| checkered | 1 | 100.0% | 0.0% |",
        "| noisy | 0 | - | - |",
        "| all | 6 | 83.3% | 50.0% |",
    ]


def test_reads_the_held_out_scenes_and_prints_the_table(tmp_path, capsys):
    model = SceneEval(SceneEvalConfig(image_size=32, patch=4, channels=[8, 16], background_channels=4)).eval()
    vq = tiny_vq(0, 32, (1, 2, 2, 4))
    truth, real, round_trip = read_backgrounds(model, vq, stream=4, count=5, batch_size=2)
    expected = [BACKGROUNDS.index(render_scene(4, i, 32)[2]["background"]["kind"]) for i in range(5)]
    assert truth.tolist() == expected and real.shape == round_trip.shape == (5,)
    model.save_pretrained(tmp_path / "sceneeval")
    vq.save_pretrained(tmp_path / "vq")
    main(["--count", "3", "--sceneeval", str(tmp_path / "sceneeval"), "--vq", str(tmp_path / "vq")])
    assert capsys.readouterr().out.splitlines()[-1].startswith("| all | 3 | ")
