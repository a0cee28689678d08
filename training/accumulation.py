"""Gradient accumulation over `trainer.accumulate_grad_batches` = N micro-batches for every training module.

The automatically optimised modules (AR, SceneEval) get it from Lightning. The manually optimised ones (the
up/down-sampler and the tokenizer, whose generator and discriminator take turns) accumulate themselves:
they scale each micro-batch's losses by 1/N and step their optimisers, schedule, EMA, clipping and generator
step counter only when `ends_accumulation` says so. Lightning refuses `Trainer(accumulate_grad_batches=N)`
for manual optimisation at the start of fit, so `mulo-train` builds the Trainer with 1 and adds
`ManualAccumulation(N)`, which gives the Trainer N once that check has passed: Lightning's loop then counts
steps, logging intervals and the logged step axis per optimiser step, as it does for automatic modules.

Setting the Trainer's N after that check and reading `fit_loop.epoch_loop.batch_progress` are no public API:
pyproject.toml allows only the Lightning minor release that CI tests, at its pinned and its lowest version
(.ci/run: tests/training/test_accumulation.py and the resume tests).
"""

from __future__ import annotations

import lightning as L
from omegaconf import DictConfig


def ends_accumulation(trainer: L.Trainer) -> bool:
    """Whether the current training batch ends an accumulation window, so the optimisers step after it: every
    N-th batch of the epoch and the epoch's last one, Lightning's own rule for when an optimiser steps
    (`_TrainingEpochLoop._should_accumulate`), so both count the same steps."""
    ready = trainer.fit_loop.epoch_loop.batch_progress.current.ready
    epoch_done = ready == trainer.num_training_batches or trainer.is_last_batch
    return ready % trainer.accumulate_grad_batches == 0 or epoch_done


class ManualAccumulation(L.Callback):
    """Gives the Trainer `accumulate_grad_batches` after Lightning's check that refuses it for manual
    optimisation (the Trainer is built with 1); the module accumulates itself (`ends_accumulation`)."""

    def __init__(self, batches: int):
        self.batches = batches

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "fit":
            trainer.accumulate_grad_batches = self.batches


def manual_accumulation(trainer: DictConfig, model: L.LightningModule) -> ManualAccumulation | None:
    """Checks `trainer.accumulate_grad_batches`; for a manually optimised `model` with N > 1, the callback
    that gives the Trainer N (build the Trainer with accumulate_grad_batches=1 then), else None."""
    batches = trainer.get("accumulate_grad_batches", 1)
    if isinstance(batches, bool) or not isinstance(batches, int) or batches < 1:
        raise ValueError(f"trainer.accumulate_grad_batches must be an integer >= 1, got {batches!r}")
    if model.automatic_optimization or batches == 1:
        return None
    if not getattr(model, "accumulates_gradients", False):
        raise ValueError(
            f"trainer.accumulate_grad_batches={batches}: {type(model).__name__} optimises manually and does "
            "not accumulate gradients itself (no `accumulates_gradients`): set it to 1"
        )
    return ManualAccumulation(batches)
