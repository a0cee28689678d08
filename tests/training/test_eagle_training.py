import math

import pytest
import torch
from mulo_sd.training.eagle_module import EagleLightning
from mulo_sd.training.train import run
from omegaconf import OmegaConf

from mulo_sd.decoding.methods import decode_ar, decode_eagle2
from mulo_sd.decoding.sampling import SamplerConfig
from mulo_sd.nets.eagle_head import EagleHead, EagleHeadConfig
from mulo_sd.nets.gpt import GPT
from mulo_sd.nets.gpt_config import GPTConfig
from mulo_sd.testbed.captions import MAX_CAPTION_WORDS, VOCAB
from tests.data.test_pretokenize import tiny_vq
from tests.helpers import compose_train_config


def tiny_target(folder):
    torch.manual_seed(0)
    config = GPTConfig(
        vocab_size=64, grid_size=(16, 16), dim=32, n_layer=1, n_head=2, cond_type="words",
        cond_len=MAX_CAPTION_WORDS, cond_vocab_size=len(VOCAB), caption_dim=16, multiple_of=16,
    )  # fmt: skip
    model = GPT(config)
    torch.nn.init.normal_(model.output.weight, std=0.5)
    return str(model.save_pretrained(folder))


def test_eagle_head_experiment_trains_exports_and_decodes_exactly(tmp_path):
    vq = str(tiny_vq(0).save_pretrained(tmp_path / "vq"))
    target_folder = tiny_target(tmp_path / "target")
    overrides = [
        "experiment=testbed/eagle_head",
        f"model.target={target_folder}",
        f"data.pretokenize.tokenizer={vq}",
        "data.generate.train.count=32",
        "data.generate.val.count=8",
        "data.train_samples_per_epoch=32",
        "data.val_samples=8",
        "data.batch_size=4",
        "data.num_workers=0",
        "data.shuffle_buffer=8",
        "model.optim.warmup_steps=1",
        "trainer.max_steps=3",
        "trainer.val_check_interval=3",
        "trainer.enable_progress_bar=false",
        f"export={tmp_path / 'head'}",
    ]
    metrics = run(compose_train_config(tmp_path, overrides))
    assert all(math.isfinite(metrics[name]) for name in ("val/loss", "val/feature", "val/ce"))
    assert 0.0 <= metrics["val/top1"] <= 1.0

    target, head = GPT.from_pretrained(target_folder), EagleHead.from_pretrained(tmp_path / "head")
    head.check_target(target)
    words = torch.zeros(1, MAX_CAPTION_WORDS, dtype=torch.long)
    greedy = SamplerConfig(temperature=0.0, cfg_scale=2.0)
    expected = decode_ar(target, words, greedy, torch.Generator().manual_seed(0)).tokens
    result = decode_eagle2(
        target, head, words, greedy, torch.Generator().manual_seed(0), depth=3, top_k=2, total_tokens=6
    )
    assert torch.equal(result.tokens, expected)


def test_eagle_init_from_carries_a_head_to_a_larger_grid_and_refuses_another_width(tmp_path):
    small = GPT.from_pretrained(tiny_target(tmp_path / "target16"))
    torch.manual_seed(1)
    head = EagleHead(EagleHeadConfig.for_target(small.config))
    head_folder = str(head.save_pretrained(tmp_path / "head16"))
    large = GPT(GPTConfig(**{**small.config.__dict__, "grid_size": (32, 32)}))
    large_folder = str(large.save_pretrained(tmp_path / "target32"))
    optim = OmegaConf.create({"lr": 1e-3, "betas": [0.9, 0.95], "weight_decay": 0.0, "warmup_steps": 1,
                              "total_steps": 2, "min_lr_ratio": 0.1, "grad_clip": 0.5})  # fmt: skip
    loss = OmegaConf.create({"feature_weight": 1.0, "ce_weight": 0.1})

    module = EagleLightning(large_folder, "tok32", OmegaConf.create({}), optim, loss, init_from=head_folder)
    assert module.head.config.grid_size == (32, 32)
    for name, weight in head.state_dict().items():
        assert torch.equal(module.head.state_dict()[name], weight), name
    fresh = EagleLightning(large_folder, "tok32", OmegaConf.create({}), optim, loss)
    assert not torch.equal(fresh.head.fc.weight, module.head.fc.weight)

    with pytest.raises(ValueError, match=r"init_from .*head16 does not fit the configured EAGLE head"):
        EagleLightning(large_folder, "tok32", OmegaConf.create({"multiple_of": 64}), optim, loss,
                       init_from=head_folder)  # fmt: skip
