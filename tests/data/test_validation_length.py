"""The validation loader has a length, so Lightning's validation progress bar shows a total."""

from __future__ import annotations

import lightning as L
import pytest
from lightning.pytorch.callbacks import TQDMProgressBar

from tests.data.test_datamodule import MeanImage, make, shards  # noqa: F401 (shards: the fixture)


@pytest.mark.parametrize(
    ("val_samples", "batch_size", "num_workers", "world_size"),
    [(10, 4, 0, 1), (10, 4, 2, 1), (7, 4, 2, 1), (12, 5, 2, 1), (11, 2, 0, 2), (11, 2, 2, 2)],
)
def test_the_length_is_the_number_of_batches(shards, val_samples, batch_size, num_workers, world_size):  # noqa: F811
    for rank in range(world_size):
        loader = make(
            shards, val_samples=val_samples, batch_size=batch_size, num_workers=num_workers, rank=rank,
            world_size=world_size,
        ).val_dataloader()  # fmt: skip
        assert len(loader) == len(list(loader))


def test_a_shard_set_smaller_than_val_samples_ends_before_the_length(shards):  # noqa: F811
    loader = make(shards, val_samples=20).val_dataloader()  # the shards hold 12 samples
    assert len(loader) == 5 and len(list(loader)) == 3  # an upper bound: nothing is cut off


def test_without_val_samples_there_is_no_length(shards):  # noqa: F811
    with pytest.raises(TypeError):
        len(make(shards).val_dataloader())


class BarTotal(TQDMProgressBar):
    """The validation bar's total when its first batch ends."""

    def on_validation_batch_end(self, trainer, *args, **kwargs):
        super().on_validation_batch_end(trainer, *args, **kwargs)
        self.seen_total = self.val_progress_bar.total


def test_lightnings_validation_bar_shows_the_total(shards, tmp_path):  # noqa: F811
    bar = BarTotal()
    trainer = L.Trainer(
        accelerator="cpu", logger=False, enable_checkpointing=False, enable_model_summary=False,
        default_root_dir=tmp_path, callbacks=[bar],
    )  # fmt: skip
    trainer.validate(MeanImage(), datamodule=make(shards, val_samples=10), verbose=False)
    assert trainer.num_val_batches == [3] and bar.seen_total == 3
