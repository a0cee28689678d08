"""The W&B run id travels with the checkpoint: a resumed run continues the same W&B run
(training/wandb_resume.py)."""

from __future__ import annotations

import logging
import pickle

import pytest
import torch
from lightning.pytorch.loggers import WandbLogger
from mulo_sd.training.train import run
from mulo_sd.training.wandb_resume import RUN_ID_KEY, continue_wandb_run
from omegaconf import OmegaConf

from tests.helpers import compose_train_config
from tests.training.test_train_vq import TINY_VQ


def logger_config(tmp_path, *overrides):
    return compose_train_config(tmp_path, ["logger=wandb", *overrides]).logger


def test_a_resumed_run_takes_the_checkpoints_wandb_id_and_an_explicit_id_wins(tmp_path, caplog):
    ckpt = tmp_path / "last.ckpt"
    torch.save({RUN_ID_KEY: "run123", "state_dict": {"w": torch.zeros(2)}}, ckpt)
    assert continue_wandb_run(logger_config(tmp_path), str(ckpt)).wandb.id == "run123"
    assert continue_wandb_run(logger_config(tmp_path, "logger.wandb.id=mine"), str(ckpt)).wandb.id == "mine"
    assert continue_wandb_run(logger_config(tmp_path), None).wandb.id is None  # a fresh run
    csv = compose_train_config(tmp_path, []).logger
    assert continue_wandb_run(csv, str(ckpt)) is csv
    torch.save({"state_dict": {}}, ckpt)  # written without a W&B logger
    with caplog.at_level(logging.WARNING):
        assert continue_wandb_run(logger_config(tmp_path), str(ckpt)).wandb.id is None
    assert "holds no W&B run id" in caplog.text


def test_an_older_checkpoints_id_is_read_only_when_trusted(tmp_path):
    ckpt = tmp_path / "old.ckpt"  # hyperparameters as OmegaConf nodes, as older versions wrote them
    torch.save({RUN_ID_KEY: "old1", "hyper_parameters": OmegaConf.create({"sizes": [1, 2]})}, ckpt)
    assert continue_wandb_run(logger_config(tmp_path), str(ckpt), weights_only=False).wandb.id == "old1"
    with pytest.raises(pickle.UnpicklingError, match="DictConfig"):
        continue_wandb_run(logger_config(tmp_path), str(ckpt))


@pytest.mark.slow  # starts W&B's service process twice
def test_resuming_with_ckpt_path_continues_the_offline_wandb_run(tmp_path, monkeypatch):
    for name in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(name, str(tmp_path / "wandb_home"))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    logged = []  # (run id, Lightning's step) of each training-loss row the W&B logger sent
    original = WandbLogger.log_metrics

    def record(self, metrics, step=None):
        if "train/loss" in metrics:
            logged.append((self.experiment.id, step))
        return original(self, metrics, step)

    monkeypatch.setattr(WandbLogger, "log_metrics", record)
    common = [*TINY_VQ, "logger=wandb", "trainer.val_check_interval=100"]
    run(compose_train_config(tmp_path / "first", [*common, "trainer.max_steps=2"]))
    (first_folder,) = (tmp_path / "first" / "run" / "wandb").glob("offline-run-*")
    run_id = first_folder.name.rsplit("-", 1)[1]
    assert {step for rid, step in logged} == {0, 1} and {rid for rid, step in logged} == {run_id}
    logged.clear()
    ckpt = tmp_path / "first" / "run" / "checkpoints" / "last.ckpt"
    run(compose_train_config(tmp_path / "second", [*common, "trainer.max_steps=4", f"ckpt_path={ckpt}"]))
    (second_folder,) = (tmp_path / "second" / "run" / "wandb").glob("offline-run-*")
    assert second_folder.name.endswith(f"-{run_id}")  # the same W&B run, continued
    assert {step for rid, step in logged} == {2, 3} and {rid for rid, step in logged} == {run_id}
