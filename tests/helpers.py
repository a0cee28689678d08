"""Helpers shared by test files: compose `mulo-train` configs the way the Hydra entry point does; build tiny
random models; read the CSV files runs write."""

from __future__ import annotations

import csv
import os
from pathlib import Path

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from mulo_sd.training.config import CONFIG_DIR
from omegaconf import DictConfig, open_dict

from mulo_sd.nets.gpt import GPT
from mulo_sd.nets.gpt_config import GPTConfig
from mulo_sd.nets.vq import VQModel
from mulo_sd.nets.vq_config import VQConfig


def compose_train_config(tmp_path: Path, overrides: list[str]) -> DictConfig:
    """The `train` config with `overrides`, all outputs (data, logs, run dir) under `tmp_path`.

    Sets the Hydra runtime config as `mulo-train` would, so `${hydra:runtime.output_dir}` (paths.output_dir)
    resolves to the run dir; `mulo_sd.training.train.run(cfg)` can then be called directly.
    """
    run_dir = tmp_path / "run"
    defaults = [f"paths.data_dir={tmp_path / 'data'}", f"paths.log_dir={tmp_path / 'logs'}"]
    with hydra.initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = hydra.compose(
            "train", overrides=[*defaults, *overrides, f"hydra.run.dir={run_dir}"], return_hydra_config=True
        )
    with open_dict(cfg):  # Hydra's launcher fills this in when it creates the run dir; compose does not
        cfg.hydra.runtime.output_dir = os.path.abspath(cfg.hydra.run.dir)
    HydraConfig.instance().set_config(cfg)
    with open_dict(cfg):  # the task function of `mulo-train` gets the config without its `hydra` node
        del cfg["hydra"]
    return cfg


def tiny_gpt(
    grid: tuple[int, int],
    vocab: int,
    seed: int,
    dim: int = 32,
    n_layer: int = 2,
    n_head: int = 4,
    head_std: float = 1.0,
) -> GPT:
    """A random GPT conditioned on 3 caption words, in eval mode and float64 (cached and full forwards,
    batched and one-token calls then agree far below any draw's or argmax's margin). LlamaGen's init zeroes
    the output head (all logits equal); `head_std` sets how peaked its logits are."""
    torch.manual_seed(seed)
    config = GPTConfig(
        vocab_size=vocab, grid_size=grid, dim=dim, n_layer=n_layer, n_head=n_head, cond_type="words",
        cond_len=3, cond_vocab_size=10, caption_dim=16, multiple_of=16,
    )  # fmt: skip
    model = GPT(config).eval()
    torch.nn.init.normal_(model.output.weight, std=head_std)
    return model.double()


def tiny_vq(seed: int = 0, codebook_size: int = 64, ch_mult: tuple = (1, 1, 1, 1), **overrides) -> VQModel:
    """A random VQ in eval mode, downsampling by 2 ** (len(ch_mult) - 1); `overrides` set VQConfig fields."""
    torch.manual_seed(seed)
    fields = dict(codebook_embed_dim=4, z_channels=8, ch=8, num_res_blocks=1, norm_groups=4) | overrides
    mult = list(ch_mult)
    config = VQConfig(codebook_size=codebook_size, encoder_ch_mult=mult, decoder_ch_mult=mult, **fields)
    return VQModel(config).eval()


def read_csv(path: Path) -> list[dict[str, str]]:
    """The rows of a CSV file with a header (runs.csv, summary.csv, ...)."""
    with open(path, newline="") as f:
        return list(csv.DictReader(f))
