"""What a training run tells its user: the run folder on stdout when it starts and ends (with the exported
model's folder), and sample grids whose rows are named in the image."""

from __future__ import annotations

import numpy as np
from mulo_sd.training.train import run
from PIL import Image

from tests.helpers import compose_train_config
from tests.training.test_ar_training import tiny_run_overrides, vq_folder  # noqa: F401 (vq_folder: fixture)


def test_a_run_prints_its_folder_at_start_and_end_and_the_exported_model(tmp_path, vq_folder, capsys):  # noqa: F811
    cfg = compose_train_config(tmp_path, [*tiny_run_overrides(vq_folder), f"export={tmp_path / 'gpt'}"])
    run(cfg)
    lines = capsys.readouterr().out.splitlines()
    folder = str(tmp_path / "run")
    assert lines[0] == f"run folder (checkpoints, logs): {folder}"
    assert f"done; run folder: {folder}" in lines and f"exported model: {tmp_path / 'gpt'}" in lines
    assert lines.index(f"done; run folder: {folder}") > 0
    # the sample grid: ground truth over samples (2 of 16 px here), a label column on their left
    grid = np.asarray(Image.open(tmp_path / "run" / "csv" / "samples" / "step000003.png").convert("L"))
    size = (grid.shape[0] - 2) // 2 - 2  # two rows of square images, 2 px apart
    images_width = 2 * (size + 2) + 2
    assert grid.shape[1] > images_width + 40  # the label column
    labels = grid[:, : grid.shape[1] - images_width]
    for row in range(2):  # text drawn in each row's band
        band = labels[2 + row * (size + 2) : 2 + row * (size + 2) + size]
        assert (band < 128).sum() > 20, row


def test_without_export_the_end_names_only_the_run_folder(tmp_path, vq_folder, capsys):  # noqa: F811
    run(compose_train_config(tmp_path, [*tiny_run_overrides(vq_folder), "trainer.max_steps=1",
                                        "trainer.val_check_interval=1", "model.samples=null"]))  # fmt: skip
    out = capsys.readouterr().out
    assert f"done; run folder: {tmp_path / 'run'}" in out and "exported model" not in out


def test_a_run_with_validation_switched_off_trains_and_exports(tmp_path, vq_folder):  # noqa: F811
    """trainer.limit_val_batches=0: the closing validation returns nothing (it raised IndexError here)."""
    cfg = compose_train_config(tmp_path, [*tiny_run_overrides(vq_folder), "trainer.max_steps=2",
                                          "+trainer.limit_val_batches=0", "model.samples=null",
                                          f"export={tmp_path / 'gpt'}"])  # fmt: skip
    metrics = run(cfg)
    assert not any(name.startswith("val/") for name in metrics)
    assert (tmp_path / "gpt" / "model.safetensors").is_file()
