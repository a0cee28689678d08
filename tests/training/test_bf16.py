"""bf16-mixed, the precision of the GPU trainers (conf/trainer/gpu.yaml; ddp.yaml and slurm.yaml inherit it),
trains every module: the manually optimised ones with their GANs, and the frozen float32 tokenizer parts. Run
here on the CPU (`trainer=gpu trainer.accelerator=cpu`), where PyTorch's autocast also runs in bfloat16."""

from __future__ import annotations

import math

import pytest
from mulo_sd.training.train import run

from tests.helpers import compose_train_config, tiny_vq
from tests.testbed.test_sceneeval import dev_run_overrides
from tests.training.test_ar_training import tiny_run_overrides
from tests.training.test_sampler_training import CODES, tiny, tiny_target
from tests.training.test_train_vq import TINY_VQ

BF16_ON_CPU = [
    "trainer=gpu",
    "trainer.accelerator=cpu",
    "trainer.max_steps=3",
    "trainer.val_check_interval=3",
]


@pytest.mark.parametrize("trainer", ["gpu", "ddp", "slurm"])
def test_the_gpu_trainers_train_in_bf16_mixed(tmp_path, trainer):
    assert compose_train_config(tmp_path, [f"trainer={trainer}"]).trainer.precision == "bf16-mixed"


def module_overrides(module: str, tmp_path) -> list[str]:
    if module in ("vq", "vq_gan"):
        gan = ["loss.gan.weight=0.1", "loss.gan.start=1", "loss.gan.discriminator.channels=8"]
        return [*TINY_VQ, *(gan if module == "vq_gan" else [])]
    if module == "target":
        return tiny_run_overrides(str(tiny_vq(0).save_pretrained(tmp_path / "vq")))
    if module == "sceneeval":
        return [o for o in dev_run_overrides(tmp_path) if not o.startswith("paths.output_dir")]
    folders = {"vq": str(tiny_vq(0, CODES, (1, 2)).save_pretrained(tmp_path / "vq"))}
    if module == "downsampler":
        return tiny(folders, "testbed/downsampler_r2")
    target = str(tiny_target(16).save_pretrained(tmp_path / "target"))
    return [*tiny(folders, target=target), "loss=mse_lpips_gan", "loss.gan.start=1"]


@pytest.mark.slow  # one short run per module
@pytest.mark.parametrize("module", ["vq", "vq_gan", "target", "upsampler_gan", "downsampler", "sceneeval"])
def test_every_module_trains_in_bf16_mixed(tmp_path, module):
    cfg = compose_train_config(tmp_path, [*module_overrides(module, tmp_path), *BF16_ON_CPU])
    assert cfg.trainer.precision == "bf16-mixed"
    metrics = run(cfg)
    assert any(name.startswith("val/") for name in metrics)
    assert all(math.isfinite(value) for value in metrics.values()), metrics
