"""Checkpoints (training/checkpoints.py, training/callbacks.py FinalStep): they load with
torch.load(weights_only=True), `train.run` refuses a file that needs more unless trust_checkpoint=true, and a
run ends with one last.ckpt of its final step."""

from __future__ import annotations

import pytest
import torch
from mulo_sd.training.checkpoints import weights_only_loading
from mulo_sd.training.train import run
from mulo_sd.training.vq_module import VQLightning
from omegaconf import OmegaConf

from tests.helpers import compose_train_config
from tests.training.test_train_vq import TINY_VQ


class Payload:
    """Any pickled object: unpickling one may run code."""


def test_run_ends_with_one_weights_only_last_checkpoint_of_its_final_step(tmp_path):
    # max_steps below the interval: ModelCheckpoint saves nothing during the fit, then last.ckpt at its end
    common = [*TINY_VQ, "trainer.val_check_interval=100", "callbacks.checkpoint.every_n_train_steps=3"]
    run(compose_train_config(tmp_path, [*common, "trainer.max_steps=2"]))
    checkpoints = tmp_path / "run" / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["last.ckpt"]  # no last-v1.ckpt
    last = torch.load(checkpoints / "last.ckpt", map_location="cpu", weights_only=True)
    assert last["global_step"] == 2
    assert last["hyper_parameters"]["optim"]["total_steps"] == 2  # resolved, plain: ${trainer.max_steps}
    assert isinstance(last["hyper_parameters"]["loss"], dict)

    resume = [*common, "trainer.max_steps=4", f"ckpt_path={checkpoints / 'last.ckpt'}"]
    run(compose_train_config(tmp_path, resume))  # into the same folder
    assert sorted(p.name for p in checkpoints.iterdir()) == ["last.ckpt", "step000003.ckpt"]
    assert torch.load(checkpoints / "last.ckpt", map_location="cpu", weights_only=True)["global_step"] == 4

    module = VQLightning.load_from_checkpoint(checkpoints / "last.ckpt", weights_only=True)
    assert module.optim_cfg.total_steps == 4 and module.vq.codebook_size == 64


# what each file pickles, as the error names it (among the globals it lists)
FOREIGN = {
    "arbitrary object": (
        {"state_dict": {}, "payload": Payload()},
        r"tests\.training\.test_checkpoints\.Payload",
    ),
    "older checkpoint": (
        {"hyper_parameters": {"l": OmegaConf.create({"l1": 1})}},
        r"omegaconf\S*\.DictConfig",
    ),
}


@pytest.mark.parametrize("kind", FOREIGN)
@pytest.mark.parametrize("validate_first", [False, True])
def test_checkpoint_holding_pickled_objects_is_refused_naming_the_opt_in(tmp_path, kind, validate_first):
    content, needs = FOREIGN[kind]
    path = tmp_path / "foreign.ckpt"
    torch.save(content, path)
    overrides = [*TINY_VQ, f"ckpt_path={path}", f"validate_first={validate_first}"]
    listed = rf"\([^)]*{needs}[^)]*\)"
    expected = rf"ckpt_path={path}: the file holds pickled Python objects {listed}.*trust_checkpoint=true"
    with pytest.raises(ValueError, match=expected):
        run(compose_train_config(tmp_path, overrides))
    assert not (tmp_path / "run" / "checkpoints").exists()  # refused before anything ran


def test_trusted_checkpoints_are_loaded_without_the_check(tmp_path):
    path = tmp_path / "foreign.ckpt"
    torch.save({"payload": Payload()}, path)
    assert weights_only_loading(str(path), trust=True) is False
    torch.save({"state_dict": {"w": torch.zeros(2)}, "numpy": ("MT19937", torch.zeros(3), 1, 0, 0.0)}, path)
    assert weights_only_loading(str(path), trust=False) is True
    assert weights_only_loading(None, trust=False) is True


@pytest.mark.parametrize("trust", [False, True])
@pytest.mark.parametrize("kept", [0.5, 0.0], ids=["truncated", "empty"])
def test_a_truncated_checkpoint_is_refused_naming_it_and_the_readable_ones_beside_it(tmp_path, trust, kept):
    folder = tmp_path / "old" / "checkpoints"
    folder.mkdir(parents=True)
    for name in ("step000003.ckpt", "step000006.ckpt", "last.ckpt"):
        torch.save({"state_dict": {"w": torch.arange(1000.0)}, "global_step": 6}, folder / name)
    for name in ("step000006.ckpt", "last.ckpt"):  # a copy, or a save, that stopped part way
        data = (folder / name).read_bytes()
        (folder / name).write_bytes(data[: int(len(data) * kept)])
    last = folder / "last.ckpt"
    overrides = [*TINY_VQ, f"ckpt_path={last}", f"trust_checkpoint={trust}"]
    expected = (
        rf"ckpt_path={last}: not a readable checkpoint \({last.stat().st_size} bytes; .*truncated or corrupt"
    )
    with pytest.raises(ValueError, match=expected) as refused:
        run(compose_train_config(tmp_path, overrides))
    assert str(refused.value).endswith(f"Readable checkpoints beside it in {folder}: step000003.ckpt.")
    assert not (tmp_path / "run" / "checkpoints").exists()  # refused before anything ran
