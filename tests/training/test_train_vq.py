"""Tokenizer training end to end through `mulo_sd.training.train.run`: fast dev run + export, exact resume,
DDP."""

from __future__ import annotations

import csv

import pytest
import torch
from mulo_sd.training.train import run

from mulo_sd.nets.vq import VQModel
from tests.helpers import compose_train_config

TINY_VQ = [
    "experiment=testbed/vq",
    "data.image_size=32",
    "data.extra_sizes=[16]",
    "data.batch_size=4",
    "data.num_workers=0",
    "data.val_samples=8",
    "data.train_samples_per_epoch=64",
    "data.generate.train.count=64",
    "data.generate.val.count=16",
    "model.image_keys=[image,image_16]",
    "model.tokenizer.ch=8",
    "model.tokenizer.encoder_ch_mult=[1,2]",
    "model.tokenizer.decoder_ch_mult=[1,2]",
    "model.tokenizer.z_channels=16",
    "model.tokenizer.norm_groups=4",
    "model.tokenizer.codebook_size=64",
    "model.optim.warmup_steps=2",
    "trainer.log_every_n_steps=1",
    "trainer.enable_progress_bar=false",
]


def logged(run_dir, name: str) -> dict[int, float]:
    with open(run_dir / "csv" / "metrics.csv") as f:
        return {int(row["step"]): float(row[name]) for row in csv.DictReader(f) if row.get(name)}


def test_fast_dev_run_trains_validates_and_exports(tmp_path):
    cfg = compose_train_config(
        tmp_path, [*TINY_VQ, "trainer.max_steps=4", "trainer.val_check_interval=4", f"export={tmp_path}/vq"]
    )
    metrics = run(cfg)
    for size in (32, 16):
        assert 0 < metrics[f"val/psnr_{size}"] < 60
        assert 0 < metrics[f"val/codebook_usage_{size}"] <= 1
    vq = VQModel.from_pretrained(tmp_path / "vq")
    assert vq.codebook_size == 64 and vq.downsample_factor == 2
    images = torch.rand(2, 3, 32, 32) * 2 - 1
    assert vq.encode(images).shape == (2, 16, 16)
    assert (tmp_path / "run" / "checkpoints" / "last.ckpt").is_file()


def test_resume_reproduces_the_uninterrupted_losses(tmp_path):
    common = [*TINY_VQ, "trainer.max_steps=6", "trainer.val_check_interval=100",
              "callbacks.checkpoint.every_n_train_steps=3"]  # fmt: skip
    run(compose_train_config(tmp_path / "full", common))
    full = logged(tmp_path / "full" / "run", "train/loss")
    checkpoint = tmp_path / "full" / "run" / "checkpoints" / "step000003.ckpt"
    assert checkpoint.is_file()
    run(compose_train_config(tmp_path / "resumed", [*common, f"ckpt_path={checkpoint}"]))
    resumed = logged(tmp_path / "resumed" / "run", "train/loss")
    assert sorted(resumed) == [3, 4, 5]  # Lightning's step index of the 4th..6th optimiser steps
    for step in resumed:
        assert resumed[step] == pytest.approx(full[step], rel=1e-5), step


@pytest.mark.slow
def test_two_process_cpu_ddp(tmp_path):
    cfg = compose_train_config(
        tmp_path, [*TINY_VQ, "trainer=ddp_cpu", "trainer.max_steps=3", "trainer.val_check_interval=3",
                   f"export={tmp_path}/vq"],
    )  # fmt: skip
    metrics = run(cfg)
    assert metrics["val/psnr_32"] > 0
    assert VQModel.from_pretrained(tmp_path / "vq").codebook_size == 64
