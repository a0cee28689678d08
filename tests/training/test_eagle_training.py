import math

import torch
from mulo_sd.training.train import run

from mulo_sd.decoding.methods import decode_ar, decode_eagle2
from mulo_sd.decoding.sampling import SamplerConfig
from mulo_sd.nets.eagle_head import EagleHead
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
