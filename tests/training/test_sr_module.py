"""The testbed SR network's training module (training/sr_module.py): it trains on the VQ round trip of the
low-res render, and its export is a weight file the pixel up-sampler loads through spandrel."""

import pytest
import torch
from mulo_sd.training.sr_module import SRLightning
from omegaconf import OmegaConf

from mulo_sd.nets.sr_network import SR_FILE_NAME, SRNetwork
from mulo_sd.pipeline.roles import TESTBED_DIR

OPTIM = {"lr": 1e-3, "betas": [0.9, 0.99], "weight_decay": 0.0, "warmup_steps": 1, "total_steps": 2,
         "min_lr_ratio": 0.1}  # fmt: skip


def module(r: int = 2) -> SRLightning:
    torch.manual_seed(0)
    network = OmegaConf.create({"num_feat": 8, "num_conv": 1})
    return SRLightning(r, 32, str(TESTBED_DIR / "vq"), network, OmegaConf.create(OPTIM),
                       OmegaConf.create({"l1_weight": 1.0, "spectrum_weight": 10.0}))  # fmt: skip


def test_export_loads_back_through_spandrel(tmp_path):
    sr = module()
    batch = {"image": torch.rand(2, 3, 32, 32) * 2 - 1, "image_16": torch.rand(2, 3, 16, 16) * 2 - 1}
    loss = sr.training_step(batch, 0)
    loss.backward()
    assert sr.network.body[0].weight.grad is not None and sr.vq.codebook.grad is None
    sr.export(tmp_path)
    loaded = SRNetwork(tmp_path / SR_FILE_NAME, 2)
    low = sr.network_input(batch)
    assert loaded.architecture == "RealESRGAN Compact"
    assert torch.allclose(loaded(low), sr.enlarge(low).clamp(-1, 1).detach(), atol=1e-6)


def test_missing_low_res_image_names_the_setting():
    with pytest.raises(ValueError, match=r"no 'image_16': add 16 to data.extra_sizes"):
        module().network_input({"image": torch.zeros(1, 3, 32, 32)})
