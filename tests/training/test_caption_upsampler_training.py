"""Training the up-sampler that reads the caption (model.sampler.condition=caption): it reads the captions as
the target takes them, starts from a tokens-only up-sampler's weights (init_from) drafting exactly what that
one drafts, learns to use the caption, and the settings that cannot work are refused by name."""

from __future__ import annotations

import pytest
import torch
from mulo_sd.training.train import run

from mulo_sd.nets.upsampler import Upsampler
from mulo_sd.testbed.captions import VOCAB, encode_caption
from tests.training.test_sampler_training import CODES, compose_train, folders, instantiate_module, tiny  # noqa: F401

CAPTIONS = ["a red circle on a striped background", "two blue stars on a checkered background"]


def test_a_caption_reader_starts_as_its_init_and_learns_from_the_captions(folders):  # noqa: F811
    plain_dir, run_dir = folders["root"] / "plain_up", folders["root"] / "caption_up"
    plain = [*tiny(folders, target=folders["target"]), "loss=token_ce"]
    run(compose_train(folders, plain_dir, [*plain, f"export={plain_dir}/export"]))
    start = Upsampler.from_pretrained(plain_dir / "export")
    module = instantiate_module(
        folders, ["loss=token_ce", "model.sampler.condition=caption", f"model.init_from={plain_dir}/export"],
        target=folders["target"],
    )  # fmt: skip
    assert module.sampler.config.condition == "words" and module.sampler.config.condition_vocab == len(VOCAB)
    ids = torch.randint(0, CODES, (2, 8, 8))
    words = torch.stack([encode_caption(text) for text in CAPTIONS])
    assert torch.equal(module.sampler.eval()(ids, words)["logits"], start(ids)["logits"])

    overrides = [*plain, "model.sampler.condition=caption", f"model.init_from={plain_dir}/export"]
    metrics = run(compose_train(folders, run_dir, [*overrides, f"export={run_dir}/export"]))
    assert 0.0 <= metrics["val/accept@0.1"] <= 1.0
    trained = Upsampler.from_pretrained(run_dir / "export")
    logits = trained(ids, words)["logits"]
    assert not torch.allclose(logits[0], trained(ids[:1], words[1:])["logits"][0])  # the caption is read


def test_caption_settings_that_cannot_work_are_named(folders):  # noqa: F811
    with pytest.raises(
        Exception, match="sampler.condition=caption reads the captions as the target takes them"
    ):
        instantiate_module(folders, ["loss=token_ce", "model.sampler.condition=caption"], target=None)
    with pytest.raises(Exception, match="only up-samplers read captions"):
        instantiate_module(folders, ["+model.sampler.condition=caption"], "testbed/downsampler_r2")
    with pytest.raises(Exception, match="must be 'none' or 'caption'"):
        instantiate_module(folders, ["model.sampler.condition=words"], target=folders["target"])


def test_the_up_sampler_and_the_acceptance_metric_share_one_condition_per_batch(folders):  # noqa: F811
    module = instantiate_module(
        folders, ["loss=token_ce", "model.sampler.condition=caption"], target=folders["target"]
    )
    calls = []
    condition = module.condition
    module.condition = lambda batch, device: calls.append(1) or condition(batch, device)
    batch = {
        "caption": CAPTIONS,
        "tok8": torch.randint(0, CODES, (2, 4, 4)),
        "tok16": torch.randint(0, CODES, (2, 8, 8)),
    }
    module.on_validation_epoch_start()
    module.validation_step(batch, 0)
    assert len(calls) == 1 and module.val_sums["tokens"] > 0


def test_an_up_sampler_of_several_hypotheses_is_validated_under_each_in_turn(folders):  # noqa: F811
    module = instantiate_module(
        folders, ["loss=token_ce", "model.sampler.condition=caption", "+model.sampler.hypotheses=3"],
        target=folders["target"],
    )  # fmt: skip
    seen = []
    forward = module.sampler.forward
    module.sampler.forward = lambda *args, hypothesis=None, **kwargs: (
        seen.append(hypothesis) or forward(*args, hypothesis=hypothesis, **kwargs)
    )
    batch = {
        "caption": [*CAPTIONS, *CAPTIONS],
        "tok8": torch.randint(0, CODES, (4, 4, 4)),
        "tok16": torch.randint(0, CODES, (4, 8, 8)),
    }
    module.on_validation_epoch_start()
    module.validation_step(batch, 0)
    assert len(seen) == 1 and seen[0].tolist() == [0, 1, 2, 0]


def test_several_hypotheses_without_a_true_token_cross_entropy_are_refused_at_set_up(folders):  # noqa: F811
    no_ce = ["loss=token_ce", "loss.ce_weight=0", "loss.mse_weight=1"]
    ce_of_a_pixel_path = ["loss=latent_distill", "loss.ce_weight=1"]
    for loss in (no_ce, ce_of_a_pixel_path):
        with pytest.raises(Exception, match="winner-takes-all cross-entropy against the true tokens"):
            instantiate_module(folders, [*loss, "+model.sampler.hypotheses=2"], target=folders["target"])
