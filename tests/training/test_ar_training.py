import csv
import math

import hydra
import pytest
import torch
from mulo_sd.training.ar_module import ARLightning
from mulo_sd.training.train import run
from omegaconf import OmegaConf

from mulo_sd.nets.fill_order import fill_order
from mulo_sd.nets.gpt import GPT
from mulo_sd.nets.gpt_config import GPTConfig
from mulo_sd.testbed.captions import MAX_CAPTION_WORDS, VOCAB, encode_caption
from tests.data.test_pretokenize import tiny_vq
from tests.helpers import compose_train_config

TINY_GPT = [
    "model.gpt.vocab_size=64",
    "model.gpt.dim=32",
    "model.gpt.n_layer=1",
    "model.gpt.n_head=2",
    "model.gpt.caption_dim=16",
]


@pytest.fixture
def vq_folder(tmp_path):
    return str(tiny_vq(0).save_pretrained(tmp_path / "vq"))


def tiny_run_overrides(vq_folder: str, experiment: str = "testbed/target") -> list[str]:
    return [
        f"experiment={experiment}",
        f"data.pretokenize.tokenizer={vq_folder}",
        "data.generate.train.count=48",
        "data.generate.val.count=16",
        "data.train_samples_per_epoch=48",
        "data.val_samples=8",
        "data.batch_size=4",
        "data.num_workers=0",
        "data.shuffle_buffer=8",
        "model.optim.warmup_steps=1",
        "model.samples.count=2",
        "trainer.max_steps=3",
        "trainer.val_check_interval=3",
        "trainer.log_every_n_steps=1",
        "trainer.enable_progress_bar=false",
        *TINY_GPT,
    ]


def test_training_run_logs_exports_and_reloads(tmp_path, vq_folder):
    cfg = compose_train_config(tmp_path, [*tiny_run_overrides(vq_folder), f"export={tmp_path / 'gpt'}"])
    metrics = run(cfg)

    assert math.isclose(metrics["val/perplexity"], math.exp(metrics["val/loss"]), rel_tol=1e-5)
    assert 0.0 <= metrics["val/acc"] <= 1.0
    with open(tmp_path / "run" / "csv" / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    for name in ["train/loss", "train/acc", "train/samples_per_s", "train/skipped_samples", "val/perplexity"]:
        assert any(row.get(name) for row in rows), name
    assert (tmp_path / "run" / "csv" / "samples" / "step000003.png").is_file()

    checkpoint = tmp_path / "run" / "checkpoints" / "last.ckpt"
    trained = ARLightning.load_from_checkpoint(checkpoint, weights_only=True).gpt.eval()
    exported = GPT.from_pretrained(tmp_path / "gpt")
    assert exported.output.weight.abs().sum() > 0  # trained: the output head starts at zero
    tokens = torch.randint(0, 64, (2, 256))
    words = torch.stack([encode_caption("a red circle on a striped background")] * 2)
    torch.testing.assert_close(exported(tokens, words), trained(tokens, words), rtol=0, atol=0)


def test_drafter_experiment_reads_its_own_grid(tmp_path, vq_folder):
    cfg = compose_train_config(tmp_path, tiny_run_overrides(vq_folder, "testbed/drafter_r4"))
    assert cfg.model.token_key == "tok4" and list(cfg.model.gpt.grid_size) == [4, 4]
    assert math.isfinite(run(cfg)["val/loss"])


def test_fill_order_drafter_trains_on_the_in_order_logits_and_samples_in_that_order(tmp_path, vq_folder):
    start = tmp_path / "start"  # the experiment fine-tunes the raster-taught drafter: a tiny one here
    cfg = compose_train_config(tmp_path, tiny_run_overrides(vq_folder, "testbed/drafter_r4_fill1"))
    GPT(GPTConfig(**OmegaConf.to_container(cfg.model.gpt))).save_pretrained(start)
    cfg.model.init_from = str(start)
    assert cfg.model.fill_window == 1 and cfg.model.token_key == "tok4"
    assert math.isfinite(run(cfg)["val/loss"])
    assert (tmp_path / "run" / "csv" / "samples" / "step000003.png").is_file()  # sampled ZipAR-style
    checkpoint = tmp_path / "run" / "checkpoints" / "last.ckpt"
    module = ARLightning.load_from_checkpoint(checkpoint, weights_only=True)
    grid, words = torch.randint(0, 64, (2, 4, 4)), torch.stack([encode_caption("a red circle")] * 2)
    keep = torch.zeros(2, dtype=torch.bool)
    logits = module.next_token_logits(module.gpt, grid, words, drop=keep)
    in_order = module.gpt.forward_in_order(grid.flatten(1), words, fill_order(4, 4, 1), drop=keep)
    assert torch.equal(logits, in_order.unflatten(1, (4, 4)).permute(0, 3, 1, 2))
    assert not torch.allclose(logits, module.next_token_logits(make_module().gpt, grid, words, drop=keep))
    with pytest.raises(ValueError, match="window must be a positive integer or None"):
        cfg = OmegaConf.create(module_config())
        ARLightning(cfg.gpt, cfg.token_key, cfg.optim, cfg.loss, fill_window=0)


def test_vocab_must_equal_the_tokenizer_codebook(tmp_path, vq_folder):
    overrides = [*tiny_run_overrides(vq_folder), "model.gpt.vocab_size=1024"]
    cfg = compose_train_config(tmp_path, overrides)
    with pytest.raises(
        Exception, match="GPT vocab_size 1024 differs from the codebook size 64 of the tokenizer"
    ):
        hydra.utils.instantiate(cfg.model, loss=cfg.loss, _recursive_=False)


def module_config(**gpt_overrides):
    gpt = {
        "vocab_size": 64,
        "grid_size": [4, 4],
        "dim": 32,
        "n_layer": 1,
        "n_head": 2,
        "cond_type": "words",
        "cond_len": MAX_CAPTION_WORDS,
        "cond_vocab_size": len(VOCAB),
        "caption_dim": 16,
        **gpt_overrides,
    }
    optim = {"lr": 1e-3, "betas": [0.9, 0.95], "weight_decay": 0.0, "warmup_steps": 1, "total_steps": 3}
    optim.update(min_lr_ratio=0.1, grad_clip=1.0)
    return {"gpt": gpt, "token_key": "tok4", "optim": optim, "loss": {"label_smoothing": 0.0}}


def make_module(ema=None, **gpt_overrides):
    cfg = OmegaConf.create(module_config(**gpt_overrides))
    return ARLightning(cfg.gpt, cfg.token_key, cfg.optim, cfg.loss, ema=ema)


def test_condition_must_be_caption_word_ids():
    with pytest.raises(ValueError, match="cond_len = MAX_CAPTION_WORDS.*got {'cond_len': 8}"):
        make_module(cond_len=8)


def test_grid_must_match_the_token_key():
    module = make_module()
    batch = {"tok4": torch.zeros(2, 8, 8, dtype=torch.long), "caption": ["a red circle"] * 2}
    with pytest.raises(
        ValueError, match="batch\\['tok4'\\] holds \\(8, 8\\) grids but the GPT's grid_size is"
    ):
        module.inputs(batch)
    with pytest.raises(ValueError, match="the batch has no 'tok4' grid: add it to data.token_keys"):
        module.inputs({"tok8": batch["tok4"], "caption": batch["caption"]})


def test_ema_follows_the_weights_and_is_exported(tmp_path):
    module = make_module(ema=0.75)
    before = [p.clone() for p in module.ema_gpt.parameters()]
    with torch.no_grad():
        for p in module.gpt.parameters():
            p.add_(1.0)
    module.update_ema()
    for old, new, live in zip(before, module.ema_gpt.parameters(), module.gpt.parameters(), strict=True):
        torch.testing.assert_close(new, 0.75 * old + 0.25 * live)
    exported = GPT.from_pretrained(module.export(tmp_path / "gpt"))
    torch.testing.assert_close(exported.output.weight, module.ema_gpt.output.weight)


def test_init_from_starts_from_a_folder_and_refuses_what_does_not_fit(tmp_path, caplog):
    old = make_module().gpt  # LlamaGen's prefix: zero rotation, no word positions
    folder = old.save_pretrained(tmp_path / "old")
    cfg = OmegaConf.create(module_config(prefix_rotation="identity", word_positions=True))
    with caplog.at_level("WARNING"):
        new = ARLightning(cfg.gpt, cfg.token_key, cfg.optim, cfg.loss, init_from=str(folder)).gpt
    assert "['word_positions'] keep their fresh init" in caplog.text
    for name, tensor in old.state_dict().items():
        assert torch.equal(new.state_dict()[name], tensor), name
    assert new.word_positions.abs().sum() > 0  # initialised, not zeros
    cfg = OmegaConf.create(module_config(dim=64))
    with pytest.raises(ValueError, match="(?s)does not fit the configured GPT: .*size mismatch"):
        ARLightning(cfg.gpt, cfg.token_key, cfg.optim, cfg.loss, init_from=str(folder))
    richer = make_module(word_positions=True).gpt.save_pretrained(tmp_path / "richer")
    cfg = OmegaConf.create(module_config())
    with pytest.raises(ValueError, match=r"has weights the configured GPT lacks: \['word_positions'\]"):
        ARLightning(cfg.gpt, cfg.token_key, cfg.optim, cfg.loss, init_from=str(richer))


def test_init_from_a_shallower_gpt_stacks_its_blocks_into_the_same_function(tmp_path):
    old = make_module(n_layer=2).gpt
    with torch.no_grad():  # trained-looking weights: a fresh GPT's zero-ish outputs would hide a mismatch
        for p in old.parameters():
            p.normal_(0.0, 0.2)
    folder = old.save_pretrained(tmp_path / "old")
    cfg = OmegaConf.create(module_config(n_layer=6))
    new = ARLightning(cfg.gpt, cfg.token_key, cfg.optim, cfg.loss, init_from=str(folder)).gpt
    assert len(new.layers) == 6
    torch.testing.assert_close(new.layers[3].attention.wqkv.weight, old.layers[1].attention.wqkv.weight)
    assert new.layers[4].feed_forward.w2.weight.abs().sum() == 0
    assert new.layers[3].feed_forward.w2.weight.abs().sum() > 0
    cond = torch.randint(0, old.config.cond_vocab_size, (3, old.config.cond_len))
    tokens = torch.randint(0, old.config.vocab_size, (3, old.config.grid_size[0] * old.config.grid_size[1]))
    old.eval(), new.eval()
    torch.testing.assert_close(new(tokens, cond), old(tokens, cond))
    cfg = OmegaConf.create(module_config(n_layer=3))
    with pytest.raises(ValueError, match=r"init_from has 2 blocks: .* a multiple of it .*got n_layer=3"):
        ARLightning(cfg.gpt, cfg.token_key, cfg.optim, cfg.loss, init_from=str(folder))


def test_a_run_ends_on_its_final_step_between_intervals(tmp_path, vq_folder):
    """max_steps=3 with checkpoints and validation every 2 steps: last.ckpt holds step 3 (the exported
    weights) and the returned metrics are step 3's validation, not step 2's."""
    overrides = [
        *tiny_run_overrides(vq_folder),
        "trainer.val_check_interval=2",
        "callbacks.checkpoint.every_n_train_steps=2",
        f"export={tmp_path / 'gpt'}",
    ]
    metrics = run(compose_train_config(tmp_path, overrides))
    checkpoints = tmp_path / "run" / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["last.ckpt", "step000002.ckpt"]
    last = torch.load(checkpoints / "last.ckpt", map_location="cpu", weights_only=True)
    assert last["global_step"] == 3
    trained = ARLightning.load_from_checkpoint(checkpoints / "last.ckpt", weights_only=True).gpt
    exported = GPT.from_pretrained(tmp_path / "gpt")
    torch.testing.assert_close(exported.state_dict(), trained.state_dict(), rtol=0, atol=0)
    with open(tmp_path / "run" / "csv" / "metrics.csv") as f:
        validated = [row for row in csv.DictReader(f) if row.get("val/loss")]
    # after step 2 (logged as 1 inside fit) and after step 3 (the extra validation, logged at 3)
    assert [int(row["step"]) for row in validated] == [1, 3]
    assert metrics["val/loss"] == pytest.approx(float(validated[-1]["val/loss"]), rel=1e-6)


@pytest.mark.slow
def test_two_process_cpu_ddp_validates_over_both_ranks_and_samples_on_rank_zero(tmp_path, vq_folder):
    """Validation sums are gathered from both ranks; rank 0 alone decodes the sample grid (the other rank
    must not stall on it) and exports."""
    overrides = [*tiny_run_overrides(vq_folder), "trainer=ddp_cpu", f"export={tmp_path / 'gpt'}"]
    metrics = run(compose_train_config(tmp_path, overrides))
    assert math.isclose(metrics["val/perplexity"], math.exp(metrics["val/loss"]), rel_tol=1e-5)
    assert (tmp_path / "run" / "csv" / "samples" / "step000003.png").is_file()
    assert GPT.from_pretrained(tmp_path / "gpt").output.weight.abs().sum() > 0
