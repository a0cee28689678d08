"""Up/down-sampler training end to end through `mulo_sd.training.train.run`, on a tiny random VQ (downsample
factor 2, 32 codes) and a tiny random target GPT over its 16x16 grids of 32 px SynthScenes images."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import hydra
import lightning as L
import pytest
import torch
import yaml
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from mulo_sd.training.config import CONFIG_DIR
from mulo_sd.training.sampler_module import SamplerLightning
from mulo_sd.training.sampler_target import accepted_draft_tokens
from mulo_sd.training.train import run

from mulo_sd.decoding.sampling import SamplerConfig
from mulo_sd.nets.downsampler import Downsampler
from mulo_sd.nets.gpt import GPT
from mulo_sd.nets.gpt_config import GPTConfig
from mulo_sd.nets.pixel_samplers import PixelUpsampler
from mulo_sd.nets.upsampler import Upsampler
from mulo_sd.testbed.captions import MAX_CAPTION_WORDS, VOCAB, encode_caption
from tests.helpers import tiny_vq

CODES = 32


def tiny_target(grid: int, vocab: int = CODES, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    config = GPTConfig(
        vocab_size=vocab,
        grid_size=(grid, grid),
        dim=32,
        n_layer=1,
        n_head=2,
        multiple_of=32,
        cond_type="words",
        cond_len=MAX_CAPTION_WORDS,
        cond_vocab_size=len(VOCAB),
        caption_dim=16,
    )
    gpt = GPT(config)
    torch.nn.init.normal_(gpt.output.weight, std=0.5)  # the zero-initialised head would give uniform p
    return gpt.eval()


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """Model folders and a shard folder shared by the module's runs."""
    root = tmp_path_factory.mktemp("sampler_training")
    return {
        "root": root,
        "vq": str(tiny_vq(0, CODES, (1, 2)).save_pretrained(root / "vq")),
        "other_vq": str(tiny_vq(1, CODES, (1, 2)).save_pretrained(root / "other_vq")),
        "target": str(tiny_target(16).save_pretrained(root / "target")),
    }


def tiny(folders, experiment: str = "testbed/upsampler_r2", target: str | None = None) -> list[str]:
    """Overrides for a 3-step run; `target` (up-samplers only): the target folder, None: no acceptance."""
    up = "upsampler" in experiment
    return [
        f"experiment={experiment}",
        *([f"model.target={target or 'null'}"] if up else []),
        f"model.tokenizer={folders['vq']}",
        "data.image_size=32",
        "data.extra_sizes=[16]",
        "data.batch_size=4",
        "data.num_workers=0",
        "data.shuffle_buffer=8",
        "data.val_samples=4",
        "data.train_samples_per_epoch=32",
        "data.generate.train.count=32",
        "data.generate.val.count=8",
        "model.sampler.width=16",
        "model.sampler.blocks=1",
        "model.optim.warmup_steps=1",
        "model.images.count=2",
        "loss.gan.start=2",
        "trainer.max_steps=3",
        "trainer.val_check_interval=3",
        "trainer.log_every_n_steps=1",
        "trainer.enable_progress_bar=false",
    ]


def compose_train(folders, run_dir: Path, overrides: list[str]):
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(
            "train",
            overrides=[
                f"paths.data_dir={folders['root']}/shards",
                f"paths.log_dir={folders['root']}/runs",
                f"hydra.run.dir={run_dir}",
                f"paths.output_dir={run_dir}",
                *overrides,
            ],
            return_hydra_config=True,
        )
    HydraConfig.instance().set_config(cfg)
    return cfg


def logged(run_dir: Path, name: str) -> dict[int, float]:
    with open(run_dir / "csv" / "metrics.csv") as f:
        return {int(row["step"]): float(row[name]) for row in csv.DictReader(f) if row.get(name)}


def recorded(folder: Path, rank: int = 0) -> list[dict]:
    return [json.loads(line) for line in (folder / f"rank{rank}.jsonl").read_text().splitlines()]


class Recorder(L.Callback):
    """Writes one json line per training batch and rank: the generator step, the batch's sample keys and a
    checksum of the discriminator's weights (also once before training, as step -1)."""

    def __init__(self, folder: str):
        self.folder = Path(folder)

    def write(self, trainer, module, step: int, keys: list[str]) -> None:
        disc = module.adversarial.discriminator if module.adversarial is not None else None
        checksum = None if disc is None else sum(p.double().sum().item() for p in disc.parameters())
        self.folder.mkdir(parents=True, exist_ok=True)
        with open(self.folder / f"rank{trainer.global_rank}.jsonl", "a") as f:
            f.write(json.dumps({"step": step, "keys": keys, "disc": checksum}) + "\n")

    def on_train_start(self, trainer, module) -> None:
        self.write(trainer, module, -1, [])

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        self.write(trainer, module, int(module.generator_step) - 1, list(batch["key"]))


def recorder(folder: Path) -> list[str]:
    return [f"+callbacks.recorder._target_={__name__}.Recorder", f"+callbacks.recorder.folder={folder}"]


@pytest.fixture(scope="module")
def gan_run(folders):
    """Six steps of CE + MSE + LPIPS + adaptively weighted PatchGAN from step 2, checkpoints at steps 3 and 6,
    exported."""
    run_dir = folders["root"] / "gan"
    overrides = [
        *tiny(folders, target=folders["target"]),
        "loss=mse_lpips_gan",
        "loss.ce_weight=1.0",
        "loss.gan.weight_mode=adaptive",
        "trainer.max_steps=6",
        "trainer.val_check_interval=6",
        "callbacks.checkpoint.every_n_train_steps=3",
        f"export={folders['root']}/gan_export",
        *recorder(run_dir / "record"),
    ]
    metrics = run(compose_train(folders, run_dir, overrides))
    return run_dir, metrics, overrides


def test_loss_mix_with_gan_validates_and_exports(folders, gan_run):
    run_dir, metrics, _ = gan_run
    for tau in (0.01, 0.05, 0.1):
        assert 0.0 <= metrics[f"val/accept@{tau}"] <= 1.0
    assert metrics["val/accept@0.01"] >= metrics["val/accept@0.05"] >= metrics["val/accept@0.1"]
    assert 0.0 <= metrics["val/acc"] <= 1.0 and metrics["val/ce"] > 0
    assert 0 < metrics["val/psnr"] < 60 and metrics["val/lpips"] > 0
    for name in ["train/ce", "train/mse", "train/lpips", "train/commit", "train/samples_per_s"]:
        assert logged(run_dir, name), name
    assert (run_dir / "csv" / "samples" / "step000006.png").is_file()
    hparams = yaml.safe_load((run_dir / "csv" / "hparams.yaml").read_text())
    assert "LPIPS(alex" in hparams["lpips_metric"] and "target" in hparams["acceptance_metric"]

    trained = SamplerLightning.load_from_checkpoint(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    exported = Upsampler.from_pretrained(folders["root"] / "gan_export")
    assert exported.config.output == "both"  # logits for CE, a code for the straight-through pixel path
    ids = torch.randint(0, CODES, (2, 8, 8))
    expected, got = trained.sampler.eval()(ids), exported(ids)
    for name in ("logits", "codes"):
        torch.testing.assert_close(got[name], expected[name], rtol=0, atol=0)


def test_adversarial_loss_and_discriminator_start_at_their_step(gan_run):
    run_dir = gan_run[0]
    g_adv = logged(run_dir, "train/g_adv")
    assert [g_adv[step] for step in (0, 1)] == [0.0, 0.0]
    assert all(g_adv[step] != 0.0 for step in (2, 3, 4, 5))
    disc = {record["step"]: record["disc"] for record in recorded(run_dir / "record")}
    assert disc[-1] == disc[0] == disc[1]  # untouched before the start step
    assert disc[1] != disc[2] != disc[3]
    assert sorted(logged(run_dir, "train/d_loss")) == [2, 3, 4, 5]


def test_resume_reproduces_the_uninterrupted_losses(folders, gan_run):
    run_dir, _, overrides = gan_run
    checkpoint = run_dir / "checkpoints" / "step000003.ckpt"  # global_step counts generator steps only
    assert checkpoint.is_file()
    resumed_dir = folders["root"] / "gan_resumed"
    resumed_overrides = [o for o in overrides if not o.startswith(("export=", "+callbacks"))]
    run(compose_train(folders, resumed_dir, [*resumed_overrides, f"ckpt_path={checkpoint}"]))
    for name in ("train/loss", "train/d_loss"):
        full, resumed = logged(run_dir, name), logged(resumed_dir, name)
        assert sorted(resumed) == [3, 4, 5]
        for step in resumed:
            assert resumed[step] == pytest.approx(full[step], rel=1e-5), (name, step)


def test_checkpoint_for_another_codebook_is_refused(folders, gan_run):
    run_dir, _, overrides = gan_run
    checkpoint = run_dir / "checkpoints" / "step000003.ckpt"
    overrides = [o for o in overrides if not o.startswith(("export=", "+callbacks", "model.tokenizer="))]
    overrides += [f"model.tokenizer={folders['other_vq']}", f"ckpt_path={checkpoint}"]
    with pytest.raises(ValueError, match="checkpoint's upsampler trained for codebook .* other vectors.*"
                       f"model.tokenizer={folders['other_vq']}"):  # fmt: skip
        run(compose_train(folders, folders["root"] / "refused", overrides))


def test_token_ce_row_exports_the_ema_weights(folders):
    run_dir = folders["root"] / "token_ce"
    overrides = [*tiny(folders, target=folders["target"]), "loss=token_ce", "model.ema=0.5"]
    metrics = run(compose_train(folders, run_dir, [*overrides, f"export={run_dir}/export"]))
    assert 0.0 <= metrics["val/accept@0.1"] <= 1.0 and metrics["val/ce"] > 0
    trained = SamplerLightning.load_from_checkpoint(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    exported = Upsampler.from_pretrained(run_dir / "export")
    assert exported.config.output == "logits"
    ids = torch.randint(0, CODES, (2, 8, 8))
    ema, live = trained.ema_sampler(ids)["logits"], trained.sampler.eval()(ids)["logits"]
    torch.testing.assert_close(exported(ids)["logits"], ema, rtol=0, atol=0)
    assert not torch.allclose(ema, live)


def test_validation_only_run_of_a_checkpoint_repeats_its_metrics(folders):
    """validate_first + ckpt_path at the checkpoint's last step: validates those weights, trains nothing."""
    run_dir = folders["root"] / "token_ce_again"
    first = run(compose_train(folders, run_dir, [*tiny(folders, target=folders["target"]), "loss=token_ce"]))
    again_dir = folders["root"] / "validate_only"
    overrides = [
        *tiny(folders, target=folders["target"]),
        "loss=token_ce",
        "validate_first=true",
        f"ckpt_path={run_dir}/checkpoints/last.ckpt",
    ]
    again = run(compose_train(folders, again_dir, overrides))
    for name in ("val/acc", "val/ce", "val/psnr", "val/accept@0.1"):
        assert again[name] == pytest.approx(first[name], rel=1e-6), name
    assert not logged(again_dir, "train/loss")
    with open(again_dir / "csv" / "metrics.csv") as f:
        assert sum(1 for row in csv.DictReader(f) if row.get("val/acc")) == 1  # validated once, not again
    assert not (again_dir / "checkpoints").exists()  # nothing trained, nothing saved


def test_pixel_space_row_is_validated_not_trained(folders):
    run_dir = folders["root"] / "pixel"
    overrides = [*tiny(folders, target=folders["target"]), "model.pixel=bicubic", "validate_first=true"]
    metrics = run(compose_train(folders, run_dir, [*overrides, "trainer.max_steps=0"]))
    assert 0.0 <= metrics["val/acc"] <= 1.0 and metrics["val/psnr"] > 0 and "val/accept@0.1" in metrics
    assert "val/ce" not in metrics  # no logits to score
    with pytest.raises(ValueError, match="pixel-space sampler, which has no weights"):
        run(compose_train(folders, folders["root"] / "pixel_train", [*overrides, "trainer.max_steps=1"]))
    with pytest.raises(Exception, match="pixel must be one of"):  # wrapped by Hydra
        instantiate_module(folders, ["model.pixel=cubic"])


def test_mse_lpips_row_soft_path_without_target(folders):
    run_dir = folders["root"] / "mse_lpips"
    overrides = [*tiny(folders, target=f"{run_dir}/none"), "loss=mse_lpips", "loss.pixel_path=soft"]
    with pytest.warns(UserWarning, match="val/accept@tau not computed: skipped: no target model at"):
        metrics = run(compose_train(folders, run_dir, overrides))
    assert not any(name.startswith("val/accept") for name in metrics)
    assert "val/ce" in metrics and metrics["val/psnr"] > 0  # soft path: logits, no CE weight
    assert logged(run_dir, "train/mse") and not logged(run_dir, "train/commit")
    hparams = yaml.safe_load((run_dir / "csv" / "hparams.yaml").read_text())
    assert hparams["acceptance_metric"].startswith("skipped: no target model at")


def test_downsampler_row_trains_and_exports(folders):
    run_dir = folders["root"] / "down"
    overrides = [*tiny(folders, "testbed/downsampler_r2"), f"export={run_dir}/export"]
    metrics = run(compose_train(folders, run_dir, overrides))
    assert 0.0 <= metrics["val/acc"] <= 1.0 and metrics["val/psnr"] > 0
    trained = SamplerLightning.load_from_checkpoint(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    exported = Downsampler.from_pretrained(run_dir / "export")
    ids = torch.randint(0, CODES, (2, 16, 16))
    torch.testing.assert_close(exported(ids), trained.sampler.eval()(ids), rtol=0, atol=0)


def instantiate_module(
    folders, overrides: list[str], experiment="testbed/upsampler_r2", target: str | None = None
) -> SamplerLightning:
    cfg = compose_train(folders, folders["root"] / "unused", [*tiny(folders, experiment, target), *overrides])
    return hydra.utils.instantiate(cfg.model, loss=cfg.loss, _recursive_=False)


def test_downsampler_refuses_pixel_losses(folders):
    with pytest.raises(Exception, match="the down-sampler trains with token cross-entropy only"):
        instantiate_module(folders, ["loss=mse_lpips"], "testbed/downsampler_r2")


def test_pretokenised_grids_are_read_and_images_encoded_otherwise(folders):
    module = instantiate_module(folders, [])
    images = {"image": torch.rand(2, 3, 32, 32) * 2 - 1, "image_16": torch.rand(2, 3, 16, 16) * 2 - 1}
    low, high = module.grids(images)
    torch.testing.assert_close(low, module.vq.encode(images["image_16"]))
    torch.testing.assert_close(high, module.vq.encode(images["image"]))
    tokens = {"tok8": torch.randint(0, CODES, (2, 8, 8)), "tok16": torch.randint(0, CODES, (2, 16, 16))}
    low, high = module.grids(tokens)
    assert low is tokens["tok8"] and high is tokens["tok16"]
    with pytest.raises(ValueError, match="neither 'tok8' \\(pre-tokenised\\) nor 'image_16'"):
        module.grids({"tok16": tokens["tok16"]})


def test_acceptance_count_matches_a_hand_computation():
    vocab, grid, k = 6, 2, 1
    target = tiny_target(grid, vocab=vocab, seed=3)
    codebook = torch.randn(vocab, 3)
    # each entry's nearest other entry, by hand
    nearest = []
    for v in range(vocab):
        others = [u for u in range(vocab) if u != v]
        nearest.append(min(others, key=lambda u: float((codebook[u] - codebook[v]).norm())))
    neighbours = torch.tensor(nearest)[:, None]
    words = torch.stack([encode_caption("a red circle"), encode_caption("two blue stars")])
    truth = torch.randint(0, vocab, (2, grid, grid))
    draft = torch.randint(0, vocab, (2, grid, grid))
    sampling = SamplerConfig(temperature=1.0, cfg_scale=2.0)

    pooled = []
    with torch.no_grad():
        for b in range(2):
            prefix = truth[b : b + 1].flatten(1)
            cond = target(prefix, words[b : b + 1], drop=torch.tensor([False]))[0]
            uncond = target(prefix, words[b : b + 1], drop=torch.tensor([True]))[0]
            for i, token in enumerate(draft[b].flatten().tolist()):
                p = torch.softmax(uncond[i] + 2.0 * (cond[i] - uncond[i]), dim=-1)
                pooled.append(float(p[token] + p[nearest[token]]))
    median = sorted(pooled)[len(pooled) // 2]
    taus = [0.0, median, max(pooled) + 1e-4]
    expected = [sum(value >= tau for value in pooled) for tau in taus]
    assert expected[0] == 8 and expected[2] == 0 and 0 < expected[1] < 8

    counts = accepted_draft_tokens(target, words, truth, draft, sampling, neighbours, k, taus)
    assert counts.tolist() == expected


def test_target_kl_row_fits_the_targets_teacher_forced_distribution(folders):
    """loss=target_kl: the logged KL is the hand-computed KL from the target's guided, teacher-forced
    distribution on the batch's true grid to the up-sampler's softmax, and no token CE is trained."""
    run_dir = folders["root"] / "target_kl"
    overrides = [*tiny(folders, target=folders["target"]), "loss=target_kl"]
    metrics = run(compose_train(folders, run_dir, overrides))
    assert "val/accept@0.01" in metrics and logged(run_dir, "train/kl") and not logged(run_dir, "train/ce")

    module = instantiate_module(folders, ["loss=target_kl"], target=folders["target"])
    truth = torch.randint(0, CODES, (2, 16, 16))
    batch = {"caption": ["a red circle", "two blue stars"], "tok16": truth, "tok8": truth[:, ::2, ::2]}
    teacher = module.target_distribution(batch, truth)
    words = torch.stack([encode_caption(text) for text in batch["caption"]])
    with torch.no_grad():
        cond = module.target(truth.flatten(1), words, drop=torch.tensor([False, False]))
        uncond = module.target(truth.flatten(1), words, drop=torch.tensor([True, True]))
    by_hand = torch.softmax(uncond + 2.0 * (cond - uncond), dim=-1)  # [B, h*w, V], CFG 2 as configured
    torch.testing.assert_close(teacher.flatten(2).transpose(1, 2), by_hand)
    terms, _, _ = module.generator_terms(batch, step=0)
    logits = module.sampler(truth[:, ::2, ::2])["logits"]
    kl = torch.nn.functional.kl_div(
        logits.log_softmax(1).permute(0, 2, 3, 1).flatten(0, 2),
        by_hand.flatten(0, 1),
        reduction="batchmean",
    )
    torch.testing.assert_close(terms["kl"], kl)
    assert set(terms) == {"kl"}


def test_on_policy_target_kl_is_teacher_forced_on_the_draft(folders):
    """loss.kl_context=draft: the teacher is the target teacher-forced on the up-sampler's own argmax draft
    (not on the truth), and a run logs the self-acceptance of its drafts next to val/accept."""
    run_dir = folders["root"] / "target_kl_draft"
    overrides = [*tiny(folders, target=folders["target"]), "loss=target_kl", "loss.kl_context=draft"]
    metrics = run(compose_train(folders, run_dir, overrides))
    assert 0.0 <= metrics["val/self_accept@0.01"] <= 1.0 and logged(run_dir, "train/kl")

    on_policy = ["loss=target_kl", "loss.kl_context=draft"]
    module = instantiate_module(folders, on_policy, target=folders["target"])
    truth = torch.randint(0, CODES, (2, 16, 16))
    batch = {"caption": ["a red circle", "two blue stars"], "tok16": truth, "tok8": truth[:, ::2, ::2]}
    logits = module.sampler(truth[:, ::2, ::2])["logits"]
    draft = logits.argmax(1)
    assert not torch.equal(draft, truth)
    on_draft = module.target_distribution(batch, draft)
    kl = torch.nn.functional.kl_div(
        logits.log_softmax(1).permute(0, 2, 3, 1).flatten(0, 2),
        on_draft.permute(0, 2, 3, 1).flatten(0, 2),
        reduction="batchmean",
    )
    terms, _, _ = module.generator_terms(batch, step=0)
    torch.testing.assert_close(terms["kl"], kl)
    with pytest.raises(Exception, match="loss.kl_context must be one of"):
        instantiate_module(folders, ["loss=target_kl", "loss.kl_context=prefix"], target=folders["target"])


def test_ce_target_distils_the_pixel_space_path(folders):
    """loss.ce_target=bicubic: the cross-entropy's labels are the pixel-space up-sampler's tokens for the
    batch's low-res grid (VQ-decode, bicubic, VQ-encode), which differ from the true high-res tokens; a run
    trains on them; the knob is refused where it would do nothing or has no meaning."""
    run_dir = folders["root"] / "ce_bicubic"
    metrics = run(compose_train(folders, run_dir, [*tiny(folders), "loss.ce_target=bicubic"]))
    assert "val/acc" in metrics and logged(run_dir, "train/acc_ce_target")

    module = instantiate_module(folders, ["loss.ce_target=bicubic"])
    truth = torch.randint(0, CODES, (2, 16, 16))
    low = truth[:, ::2, ::2]
    batch = {"caption": ["a red circle", "two blue stars"], "tok16": truth, "tok8": low}
    labels = PixelUpsampler(module.vq, 2, "bicubic").upsample(low)
    assert not torch.equal(labels, truth)
    logits = module.sampler(low)["logits"]
    terms, logs, _ = module.generator_terms(batch, step=0)
    torch.testing.assert_close(terms["ce"], torch.nn.functional.cross_entropy(logits, labels))
    torch.testing.assert_close(logs["acc_ce_target"], (logits.argmax(1) == labels).float().mean())

    with pytest.raises(Exception, match="loss.ce_target must be one of"):
        instantiate_module(folders, ["loss.ce_target=nearest"])
    with pytest.raises(Exception, match="loss.ce_target=bicubic sets the cross-entropy's labels, but"):
        instantiate_module(folders, ["loss=mse_lpips", "loss.ce_target=bicubic"])
    with pytest.raises(Exception, match="the down-sampler's cross-entropy labels are the down-scaled"):
        instantiate_module(folders, ["loss.ce_target=bicubic"], experiment="testbed/downsampler_r2")


def test_latent_distillation_fits_the_pixel_paths_encoder_codes(folders):
    """loss=latent_distill: the up-sampler's continuous code is fitted to the bicubic path's encoder codes
    (L2-normalised like the codebook), its draft is their nearest entry, and a code equal to the teacher's
    reproduces the pixel path's tokens exactly."""
    run_dir = folders["root"] / "latent_distill"
    metrics = run(compose_train(folders, run_dir, [*tiny(folders), "loss=latent_distill"]))
    assert "val/acc" in metrics and logged(run_dir, "train/acc_ce_target")

    module = instantiate_module(folders, ["loss=latent_distill"])
    assert module.sampler.config.output == "code"
    truth = torch.randint(0, CODES, (2, 16, 16))
    low = truth[:, ::2, ::2]
    batch = {"caption": ["a red circle", "two blue stars"], "tok16": truth, "tok8": low}
    teacher = PixelUpsampler(module.vq, 2, "bicubic")
    latents = teacher.latents(low)
    normalised = torch.nn.functional.normalize(latents, dim=1)
    codes = module.sampler(low)["codes"]
    terms, logs, _ = module.generator_terms(batch, step=0)
    assert set(terms) == {"latent"}
    torch.testing.assert_close(terms["latent"], torch.nn.functional.mse_loss(codes, normalised))
    labels = teacher.upsample(low)
    torch.testing.assert_close(
        logs["acc_ce_target"], (module.sampler.tokens({"codes": codes}) == labels).float().mean()
    )
    assert torch.equal(module.sampler.tokens({"codes": normalised}), labels)

    mixed = instantiate_module(folders, ["loss=latent_distill", "loss.ce_weight=1"])
    assert mixed.sampler.config.output == "both"
    terms, _, _ = mixed.generator_terms(batch, step=0)
    assert set(terms) == {"latent", "ce"}
    ce = torch.nn.functional.cross_entropy(mixed.sampler(low)["logits"], labels)
    torch.testing.assert_close(terms["ce"], ce)

    with pytest.raises(Exception, match="loss.latent_weight > 0 fits the up-sampler's code to a pixel-space"):
        instantiate_module(folders, ["loss=latent_distill", "loss.ce_target=truth"])
    with pytest.raises(Exception, match="the down-sampler's cross-entropy labels are the down-scaled"):
        instantiate_module(folders, ["loss=latent_distill"], "testbed/downsampler_r2")


def test_target_kl_needs_a_target_and_an_up_sampler(folders):
    with pytest.raises(Exception, match="loss.kl_weight > 0 distils the target's distribution, but there is"):
        instantiate_module(folders, ["loss=target_kl"])
    with pytest.raises(Exception, match="kl_weight, mse_weight, lpips_weight and gan.weight must be 0"):
        instantiate_module(folders, ["loss=target_kl"], "testbed/downsampler_r2")


@pytest.mark.slow
def test_two_process_cpu_ddp_ranks_see_different_data(folders, tmp_path):
    run_dir = tmp_path / "ddp"
    overrides = [
        *tiny(folders, target=folders["target"]),
        "trainer=ddp_cpu",
        f"export={tmp_path}/export",
        *recorder(run_dir / "record"),
    ]
    metrics = run(compose_train(folders, run_dir, overrides))
    assert 0.0 <= metrics["val/accept@0.1"] <= 1.0
    keys = [[record["keys"] for record in recorded(run_dir / "record", rank)[1:]] for rank in (0, 1)]
    assert len(keys[0]) == len(keys[1]) == 3
    assert keys[0] != keys[1]
    assert Upsampler.from_pretrained(tmp_path / "export").r == 2


@pytest.mark.slow
def test_two_process_cpu_ddp_trains_the_gan(folders, tmp_path):
    """Generator and discriminator take turns under DDP (manual optimisation): both must get gradients
    synchronised, and the run must not stall or fail on parameters one of the turns leaves unused."""
    run_dir = tmp_path / "ddp_gan"
    overrides = [
        *tiny(folders, target=folders["target"]),
        "loss=mse_lpips_gan",
        "loss.gan.start=1",
        "trainer=ddp_cpu",
        f"export={tmp_path}/export",
    ]
    metrics = run(compose_train(folders, run_dir, overrides))
    assert 0.0 <= metrics["val/accept@0.1"] <= 1.0
    assert Upsampler.from_pretrained(tmp_path / "export").r == 2
