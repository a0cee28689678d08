"""Gradient accumulation (`trainer.accumulate_grad_batches=N`, training/accumulation.py): one optimiser step
over N micro-batches equals one step over their union in the manually optimised up-sampler and tokenizer
(GAN included) and in the automatically optimised AR module (its EMA too); steps, the schedule, the GAN
start, checkpoints and the logged step axis count optimiser steps, and a resume stays exact."""

from __future__ import annotations

import copy
import csv
from collections import defaultdict
from pathlib import Path

import hydra
import lightning as L
import pytest
import torch
import torch.nn.functional as F
from mulo_sd.training.accumulation import manual_accumulation
from mulo_sd.training.ar_module import ARLightning
from mulo_sd.training.optim import warmup_cosine
from mulo_sd.training.sampler_module import SamplerLightning
from mulo_sd.training.train import run
from omegaconf import OmegaConf
from torch.utils.data import DataLoader

from mulo_sd.testbed.captions import MAX_CAPTION_WORDS, VOCAB
from tests.helpers import compose_train_config, tiny_vq

CODES = 32
B = 2  # micro-batch size

UPSAMPLER = [
    "experiment=testbed/upsampler_r2",
    "model.target=null",
    "data.image_size=32",
    "model.sampler.width=16",
    "model.sampler.blocks=1",
    "model.optim.warmup_steps=1",
]
TOKENIZER = [
    "experiment=testbed/vq",
    "model.image_keys=[image,image_16]",
    "model.codebook_restart_every=0",
    "model.tokenizer.ch=8",
    "model.tokenizer.encoder_ch_mult=[1,2]",
    "model.tokenizer.decoder_ch_mult=[1,2]",
    "model.tokenizer.z_channels=16",
    "model.tokenizer.norm_groups=4",
    "model.tokenizer.codebook_size=64",
    "model.optim.warmup_steps=1",
    "model.optim.grad_clip=1e6",  # effectively none: the gradients compared are the accumulated sums
]
FIXED_GAN = ["loss.gan.weight=0.5", "loss.gan.weight_mode=fixed", "loss.gan.start=0"]


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("accumulation")
    tiny_vq(0, CODES, (1, 2)).save_pretrained(root / "vq")  # downsample factor 2: 32 px -> 16x16 tokens
    return root


def instantiate(root: Path, overrides: list[str]) -> L.LightningModule:
    cfg = compose_train_config(root / "compose", overrides)
    torch.manual_seed(0)
    return hydra.utils.instantiate(cfg.model, loss=cfg.loss, _recursive_=False)


def upsampler(root: Path, overrides: list[str]) -> SamplerLightning:
    return instantiate(root, [*UPSAMPLER, f"model.tokenizer={root / 'vq'}", *overrides])


def image_batch(size: int, seed: int = 0) -> dict:
    """`size` random 32 px images, their 16 px downscale and the tiny VQ's token grids of both."""
    images = torch.rand(size, 3, 32, 32, generator=torch.Generator().manual_seed(seed)) * 2 - 1
    low = F.avg_pool2d(images, 2)
    vq = tiny_vq(0, CODES, (1, 2))
    with torch.no_grad():
        tokens = {"tok16": vq.encode(images), "tok8": vq.encode(low)}
    return {"key": [f"{seed}-{i}" for i in range(size)], "image": images, "image_16": low, **tokens}


def split(batch: dict, parts: int) -> list[dict]:
    size = len(batch["key"]) // parts
    return [{k: v[i * size : (i + 1) * size] for k, v in batch.items()} for i in range(parts)]


class Gradients(L.Callback):
    """The gradients each optimiser steps with (after clipping) by parameter name, in order of the steps."""

    def __init__(self):
        self.steps: list[dict[str, torch.Tensor]] = []

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        stepped = {p for group in optimizer.param_groups for p in group["params"] if p.grad is not None}
        self.steps.append({name: p.grad.clone() for name, p in pl_module.named_parameters() if p in stepped})


def fit(
    module: L.LightningModule,
    batches: list[dict],
    accumulate: int,
    validate: bool = False,
    precision="32-true",
) -> tuple[L.Trainer, Gradients]:
    """One epoch over `batches`, with the Trainer set up for `accumulate` as `mulo-train` sets it up;
    `validate`: on the first batch after every batch, inside the accumulation windows too."""
    gradients = Gradients()
    manual = manual_accumulation(OmegaConf.create({"accumulate_grad_batches": accumulate}), module)
    trainer = L.Trainer(
        accelerator="cpu",
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=1 if validate else 0,
        val_check_interval=1,
        num_sanity_val_steps=0,
        precision=precision,
        accumulate_grad_batches=accumulate if manual is None else 1,
        callbacks=[gradients] if manual is None else [gradients, manual],
    )
    loader = DataLoader(batches, batch_size=None)
    trainer.fit(module, train_dataloaders=loader, val_dataloaders=loader if validate else None)
    return trainer, gradients


def assert_same_steps(
    accumulated: L.LightningModule,
    reference: L.LightningModule,
    batch: dict,
    steps: int = 2,
    precision="32-true",
) -> Gradients:
    """`batch` (2 * steps * B samples) as 2 * steps micro-batches of B at accumulation 2 (`accumulated`) and
    as `steps` batches of 2B at 1 (`reference`, the same weights) gives the same steps: the same gradients
    and resulting weights, validation inside a window taking nothing away. Returns the accumulated run's
    gradients. `precision`: the Trainer's, for both runs."""
    acc_trainer, acc_grads = fit(accumulated, split(batch, 2 * steps), 2, validate=True, precision=precision)
    ref_trainer, ref_grads = fit(reference, split(batch, steps), accumulate=1, precision=precision)
    assert acc_trainer.global_step == ref_trainer.global_step >= steps
    assert len(acc_grads.steps) == len(ref_grads.steps) >= steps
    clear = {}
    for acc_step, ref_step in zip(acc_grads.steps, ref_grads.steps, strict=True):
        assert acc_step.keys() == ref_step.keys()
        for name, ref in ref_step.items():
            torch.testing.assert_close(acc_step[name], ref, rtol=1e-4, atol=1e-6, msg=name)
            clear[name] = clear.get(name, True) & (ref.abs() > 1e-5)
    # Adam moves a weight by about lr * g / (|g| + eps), which turns the float noise of a gradient near zero
    # (attention key biases, cancelling sums) into visible differences: weights are compared where every
    # step's gradient is clearly non-zero (most of them), the gradients above everywhere.
    assert sum(int(m.sum()) for m in clear.values()) > 0.5 * sum(m.numel() for m in clear.values())
    weights = dict(reference.named_parameters())
    for name, value in accumulated.named_parameters():
        everywhere = torch.ones_like(value, dtype=torch.bool)  # frozen weights
        mask = clear.get(name.replace("ema_", ""), everywhere)  # an EMA copy: where its live weights are
        torch.testing.assert_close(value[mask], weights[name][mask], rtol=0, atol=1e-6, msg=name)
    return acc_grads


def lone_discriminator_gradient(module: L.LightningModule, batch: dict) -> dict[str, torch.Tensor]:
    """The gradient of the discriminator's loss alone on `batch` at `module`'s weights: what the first
    discriminator step must use, with nothing of the generator's backward in it."""
    module = copy.deepcopy(module)
    if isinstance(module, SamplerLightning):
        pairs = [(batch["image"], module.generator_terms(batch, 0)[2])]
    else:
        pairs = [(batch[key], module.vq(batch[key])[0]) for key in module.image_keys]
    loss = sum(module.adversarial.discriminator_loss(real, fake, 0)[0] for real, fake in pairs)
    names, params = zip(*module.adversarial.discriminator.named_parameters(), strict=True)
    grads = torch.autograd.grad(loss, params)
    return {f"adversarial.discriminator.{name}": grad for name, grad in zip(names, grads, strict=True)}


def assert_same_steps_and_discriminator_gradient(accumulated, reference, steps: int = 2) -> None:
    batch = image_batch(2 * steps * B)
    lone = lone_discriminator_gradient(reference, split(batch, steps)[0]) if reference.adversarial else {}
    gradients = assert_same_steps(accumulated, reference, batch, steps)
    assert int(accumulated.generator_step) == int(reference.generator_step) == steps
    for name, expected in lone.items():  # steps[1]: the first discriminator step, after the generator's
        torch.testing.assert_close(gradients.steps[1][name], expected, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize(
    "overrides",
    [
        ["loss=token_ce", "model.ema=0.5", "model.optim.grad_clip=0"],
        ["loss=mse_lpips_gan", "loss.gan.start=0", "model.optim.grad_clip=0"],
        ["loss=mse_lpips_gan", "loss.gan.start=0", "model.optim.grad_clip=1e-3"],  # clips the sum
    ],
    ids=["token_ce_ema", "gan", "gan_clipped"],
)
def test_upsampler_steps_over_two_micro_batches_equal_steps_over_their_union(root, overrides):
    assert_same_steps_and_discriminator_gradient(upsampler(root, overrides), upsampler(root, overrides))


@pytest.mark.parametrize("overrides", [[], FIXED_GAN], ids=["plain", "gan"])
def test_tokenizer_steps_over_two_micro_batches_equal_steps_over_their_union(root, overrides):
    # one step (no EMA to catch): Adam amplifies the float noise of its attention key biases' zero gradients
    # enough to move a second step's gradients beyond the tolerance
    accumulated, reference = (instantiate(root, [*TOKENIZER, *overrides]) for _ in range(2))
    assert_same_steps_and_discriminator_gradient(accumulated, reference, steps=1)


def tiny_gpt() -> ARLightning:
    torch.manual_seed(0)
    gpt = {
        "vocab_size": CODES,
        "grid_size": [8, 8],
        "dim": 32,
        "n_layer": 1,
        "n_head": 2,
        "caption_dim": 16,
        "cond_type": "words",
        "cond_len": MAX_CAPTION_WORDS,
        "cond_vocab_size": len(VOCAB),
        "class_dropout_prob": 0.0,
    }
    optim = {"lr": 1e-3, "betas": [0.9, 0.95], "weight_decay": 0.0, "warmup_steps": 1, "total_steps": 3}
    optim.update(min_lr_ratio=0.1, grad_clip=0.0)
    cfg = OmegaConf.create({"gpt": gpt, "optim": optim, "loss": {"label_smoothing": 0.0}})
    module = ARLightning(cfg.gpt, "tok8", cfg.optim, cfg.loss, ema=0.5)
    torch.nn.init.normal_(
        module.gpt.output.weight, std=0.5
    )  # from zero, no other weight would get a gradient
    return module


def test_ar_module_accumulates_through_lightning_and_updates_its_ema_once_per_step():
    batch = image_batch(4 * B)
    batch["caption"] = ["a red circle", "two blue stars", "a green square", "a yellow triangle"] * 2
    # float64: in float32 the two runs' sums differ in their last bits (2 micro-batch sums vs one batch sum),
    # ~1e-6 of a tensor's largest gradient after Adam's first step, and the CPU's kernels decide whether a
    # small element of wqkv's second-step gradient lands inside rtol=1e-4 (AVX2: yes, AVX-512: no). In float64
    # the runs agree to ~1e-14, so assert_same_steps' tolerances catch a real difference on every CPU.
    assert_same_steps(tiny_gpt(), tiny_gpt(), batch, precision="64-true")  # ema_gpt.*: lerped once per step


@pytest.mark.parametrize("micro_batches, accumulate, steps", [(6, 3, 2), (7, 3, 3)])
def test_steps_count_windows_and_an_epoch_ends_on_a_step(root, micro_batches, accumulate, steps):
    """K micro-batches take K / N steps of the generator, its schedule and the discriminator; like Lightning,
    the epoch's last batch ends a (shorter) window."""
    module = upsampler(root, ["loss=mse_lpips_gan", "loss.gan.start=0", "model.ema=0.5"])
    trainer, gradients = fit(module, split(image_batch(micro_batches * B), micro_batches), accumulate)
    assert trainer.global_step == int(module.generator_step) == steps
    assert trainer.lr_scheduler_configs[0].scheduler.last_epoch == steps
    discriminator = trainer.optimizers[1]
    assert {int(state["step"]) for state in discriminator.state.values()} == {steps}
    assert len(gradients.steps) == 2 * steps  # the generator's and the discriminator's


def test_impossible_settings_are_refused_by_name():
    class Manual(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.automatic_optimization = False

    two = OmegaConf.create({"accumulate_grad_batches": 2})
    with pytest.raises(ValueError, match="trainer.accumulate_grad_batches=2: Manual optimises manually"):
        manual_accumulation(two, Manual())
    for bad in (0, 1.5):
        message = f"trainer.accumulate_grad_batches must be an integer >= 1, got {bad}"
        with pytest.raises(ValueError, match=message):
            manual_accumulation(OmegaConf.create({"accumulate_grad_batches": bad}), Manual())


def logged_rows(run_dir: Path, name: str) -> dict[int, list[float]]:
    """Every logged value of `name` by step (one row per micro-batch)."""
    rows = defaultdict(list)
    with open(run_dir / "csv" / "metrics.csv") as f:
        for row in csv.DictReader(f):
            if row.get(name):
                rows[int(row["step"])].append(float(row[name]))
    return dict(rows)


def gan_run(root: Path, name: str, overrides: list[str] = ()) -> Path:
    """4 steps of 2 micro-batches of the GAN row from step 1, checkpoints every 2 steps: its run dir."""
    data = [
        f"paths.data_dir={root / 'data'}",
        "data.extra_sizes=[16]",
        f"data.batch_size={B}",
        "data.num_workers=0",
        "data.shuffle_buffer=8",
        "data.val_samples=4",
        "data.train_samples_per_epoch=32",
        "data.generate.train.count=32",
        "data.generate.val.count=8",
    ]
    training = [
        "model.images=null",
        "loss=mse_lpips_gan",
        "loss.gan.start=1",
        "trainer.accumulate_grad_batches=2",
        "trainer.max_steps=4",
        "trainer.val_check_interval=8",
        "trainer.log_every_n_steps=1",
        "trainer.enable_progress_bar=false",
        "callbacks.checkpoint.every_n_train_steps=2",
    ]
    tokenizer = f"model.tokenizer={root / 'vq'}"
    run(compose_train_config(root / name, [*UPSAMPLER, tokenizer, *data, *training, *overrides]))
    return root / name / "run"


def test_trainer_override_counts_optimiser_steps_and_resumes_exactly(root):
    """`trainer.accumulate_grad_batches=2` as given on the command line, on the GAN row: the logged step axis,
    the GAN start, the LR schedule and the checkpoints count optimiser steps, and a resume from step 2
    repeats the uninterrupted run's losses."""
    full = gan_run(root, "full")
    losses = logged_rows(full, "train/loss")
    assert {step: len(values) for step, values in losses.items()} == {0: 2, 1: 2, 2: 2, 3: 2}
    assert sorted(logged_rows(full, "train/d_loss")) == [1, 2, 3]
    expected_lr = {step: [pytest.approx(1e-3 * warmup_cosine(step, 1, 4, 0.1))] * 2 for step in range(4)}
    assert logged_rows(full, "lr-AdamW") == expected_lr
    checkpoints = full / "checkpoints"
    names = sorted(path.name for path in checkpoints.iterdir())
    assert names == ["last.ckpt", "step000002.ckpt", "step000004.ckpt"]
    last = torch.load(checkpoints / "last.ckpt", weights_only=False)
    assert last["global_step"] == 4 and int(last["state_dict"]["generator_step"]) == 4

    resumed = gan_run(root, "resumed", [f"ckpt_path={checkpoints / 'step000002.ckpt'}"])
    for name in ("train/loss", "train/d_loss"):
        again = logged_rows(resumed, name)
        assert sorted(again) == [2, 3]
        for step, values in again.items():
            assert values == pytest.approx(logged_rows(full, name)[step], rel=1e-5), (name, step)


@pytest.mark.slow
def test_two_process_cpu_ddp_accumulates_the_gan(root):
    """Under DDP the micro-batches before a window's last skip the gradient all-reduce (toggle_model) while
    the discriminator's weights sit out the generator's backward: the run must neither fail nor stall."""
    run_dir = gan_run(root, "ddp", ["trainer=ddp_cpu"])
    last = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)
    assert last["global_step"] == 4 and int(last["state_dict"]["generator_step"]) == 4
    assert sorted(logged_rows(run_dir, "train/d_loss")) == [1, 2, 3]
