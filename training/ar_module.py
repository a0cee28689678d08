"""LightningModule that trains one GPT by next-token prediction on pre-tokenised grids with captions.

The testbed's target and drafters are all trained by this module; they differ only in the GPT config and
the token grid they read (`token_key`: tok16 for the target, tok8 / tok4 for the r=2 / r=4 drafters).
Captions become word ids (`mulo_sd.testbed.captions`); the GPT drops them with probability
`class_dropout_prob` in
training, which gives it the unconditional prefix that classifier-free guidance needs.
"""

from __future__ import annotations

import copy
import logging
import math
import time
from pathlib import Path

import lightning as L
import torch
import torchvision
from lightning.pytorch.loggers import WandbLogger
from mulo_sd.training.accumulation import ends_accumulation
from mulo_sd.training.checkpoints import config_node
from mulo_sd.training.losses import token_accuracy, token_cross_entropy
from mulo_sd.training.optim import adamw_cosine, clip_by_norm
from mulo_sd.training.sample_grid import labelled_grid
from omegaconf import DictConfig, OmegaConf

from mulo_sd.decoding.methods import decode_ar, decode_zipar
from mulo_sd.decoding.sampling import SamplerConfig
from mulo_sd.nets.fill_order import fill_order
from mulo_sd.nets.gpt import GPT
from mulo_sd.nets.gpt_config import GPTConfig
from mulo_sd.nets.vq import VQModel
from mulo_sd.testbed.captions import MAX_CAPTION_WORDS, VOCAB, encode_caption

log = logging.getLogger(__name__)

SAMPLE_ROWS = ["ground truth (decoded tokens)", "AR samples, same captions"]  # the sample grid's rows


def token_grid(batch: dict, key: str, grid_size: tuple, expected: str, hint: str = "") -> torch.Tensor:
    """The token grids [B, h, w] stored under `key`, checked against `grid_size` (`expected` names it in the
    error, e.g. "the GPT's grid_size is"; `hint` says what to change)."""
    if key not in batch:
        raise ValueError(f"the batch has no {key!r} grid: add it to data.token_keys")
    grid = batch[key]
    if tuple(grid.shape[1:]) != tuple(grid_size):
        raise ValueError(
            f"batch[{key!r}] holds {tuple(grid.shape[1:])} grids but {expected} {grid_size}{hint}"
        )
    return grid


def check_word_condition(config: GPTConfig) -> None:
    """The module feeds `encode_caption` ids: the GPT must take exactly those."""
    wanted = {"cond_type": "words", "cond_len": MAX_CAPTION_WORDS, "cond_vocab_size": len(VOCAB)}
    wrong = {name: getattr(config, name) for name, value in wanted.items() if getattr(config, name) != value}
    if wrong:
        raise ValueError(
            f"the GPT takes caption word ids from mulo_sd.testbed.captions, so it needs {wanted} "
            f"(cond_len = MAX_CAPTION_WORDS, cond_vocab_size = len(VOCAB)); got {wrong}"
        )


def check_tokenizer(config: GPTConfig, tokenizer: str | Path) -> None:
    """The GPT's vocabulary must be the codebook of the tokenizer that made (and will decode) its tokens."""
    codebook_size = VQModel.load_config(tokenizer).codebook_size
    if config.vocab_size != codebook_size:
        raise ValueError(
            f"GPT vocab_size {config.vocab_size} differs from the codebook size {codebook_size} of the "
            f"tokenizer {tokenizer}: set model.gpt.vocab_size={codebook_size}"
        )


def stack_layers(state: dict[str, torch.Tensor], n_source: int, n_target: int) -> dict[str, torch.Tensor]:
    """A GPT state dict deepened from n_source to n_target blocks (a multiple of it) that computes the same
    function: each source block is followed by n_target / n_source - 1 copies of itself whose output
    projections (attention `wo`, feed-forward `w2`) are zero, so every copy starts as the identity of its
    residual branch and learns from there (progressive stacking: new capacity, none of the trained function
    lost). Copies rather than fresh blocks so that, once their projections grow, they start from features
    that already work at that depth."""
    if n_target < n_source or n_target % n_source:
        raise ValueError(
            f"init_from has {n_source} blocks: a GPT initialised from it needs the same number or a multiple "
            f"of it (stacked), got n_layer={n_target}"
        )
    factor = n_target // n_source
    stacked = {key: value for key, value in state.items() if not key.startswith("layers.")}
    for key, value in state.items():
        if not key.startswith("layers."):
            continue
        _, index, rest = key.split(".", 2)
        for copy_index in range(factor):
            zeroed = copy_index > 0 and rest in ("attention.wo.weight", "feed_forward.w2.weight")
            stacked[f"layers.{int(index) * factor + copy_index}.{rest}"] = (
                torch.zeros_like(value) if zeroed else value.clone()
            )
    return stacked


class ARLightning(L.LightningModule):
    requires_captions = True  # the datamodule skips captionless samples (data.require_captions=null)

    def __init__(
        self,
        gpt: DictConfig,
        token_key: str,
        optim: DictConfig,
        loss: DictConfig,
        ema: float | None = None,
        tokenizer: str | None = None,
        samples: DictConfig | None = None,
        init_from: str | None = None,
        fill_window: int | None = None,
    ):
        """gpt: GPTConfig fields. token_key: the batch's grid, e.g. "tok16". optim: lr, betas, weight_decay,
        warmup_steps, total_steps, min_lr_ratio, grad_clip. loss: label_smoothing. ema: decay of an
        exponential moving average of the weights (validated and exported instead of the raw weights), or
        None. tokenizer: the VQ folder that made the tokens (its codebook size is checked against the GPT's
        vocabulary; it also decodes the sample grid). samples: count, seed and SamplerConfig fields of the
        images sampled at each validation end (needs `tokenizer`), or None. init_from: a GPT folder whose
        weights start the training (fine-tuning, or a changed architecture); parameters it lacks keep their
        fresh init and are logged, a GPT with a multiple of its blocks gets them stacked (`stack_layers`),
        anything else that differs is an error. fill_window: teach the grid in the order a ZipAR-style fill
        at this window samples it (mulo_sd/nets/fill_order.py: a drafter for `draft_window`), None: raster."""
        super().__init__()
        self.save_hyperparameters()
        gpt, optim, loss, samples = (config_node(c) for c in (gpt, optim, loss, samples))
        config = GPTConfig(**OmegaConf.to_container(gpt, resolve=True))
        check_word_condition(config)
        if tokenizer is not None:
            check_tokenizer(config, tokenizer)
        if ema is not None and not 0.0 < ema < 1.0:
            raise ValueError(f"ema must be a decay in (0, 1) or null, got {ema}")
        if samples is not None and tokenizer is None:
            raise ValueError("samples are decoded to images: set a tokenizer folder, or samples=null")
        self.gpt = GPT(config)
        self.fill_window = fill_window
        self.fill_order = None if fill_window is None else fill_order(*config.grid_size, fill_window)
        if init_from is not None:
            self.initialise_from(init_from)
        self.ema_gpt = copy.deepcopy(self.gpt).requires_grad_(False) if ema is not None else None
        self.ema_decay = ema
        self.token_key = token_key
        self.optim_cfg = optim
        self.loss_cfg = loss
        self.tokenizer = tokenizer
        self.samples_cfg = samples
        # summed token NLL, correct predictions and tokens over the validation set
        self.val_sums = torch.zeros(3, dtype=torch.float64)
        self.sample_batch: tuple[list[str], torch.Tensor] | None = None
        self.skipped_by_worker: dict[int, int] = {}
        self.last_step_time: float | None = None

    def initialise_from(self, folder: str) -> None:
        source = GPT.from_pretrained(folder)
        state = source.state_dict()
        if source.config.n_layer != self.gpt.config.n_layer:
            state = stack_layers(state, source.config.n_layer, self.gpt.config.n_layer)
            log.info(
                "init_from %s: %d blocks stacked into %d", folder, source.config.n_layer, len(self.gpt.layers)
            )
        try:
            missing, unexpected = self.gpt.load_state_dict(state, strict=False)
        except RuntimeError as error:  # shape mismatches
            raise ValueError(f"init_from {folder} does not fit the configured GPT: {error}") from None
        if unexpected:
            raise ValueError(f"init_from {folder} has weights the configured GPT lacks: {unexpected}")
        if missing:
            log.warning("init_from %s: %s keep their fresh init (not in that folder)", folder, missing)

    @property
    def eval_gpt(self) -> GPT:
        """The weights that are validated and exported: the EMA copy when there is one."""
        return self.gpt if self.ema_gpt is None else self.ema_gpt

    def configure_optimizers(self):
        return adamw_cosine([p for p in self.gpt.parameters() if p.requires_grad], self.optim_cfg)

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None):
        clip_by_norm(self, optimizer, self.optim_cfg.grad_clip)

    def inputs(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """(token grids [B, h, w], caption word ids [B, MAX_CAPTION_WORDS]) of a batch."""
        grid = token_grid(
            batch, self.token_key, self.gpt.grid_size, "the GPT's grid_size is",
            hint=": token_key and model.gpt.grid_size must match",
        )  # fmt: skip
        words = torch.stack([encode_caption(text, MAX_CAPTION_WORDS) for text in batch["caption"]])
        return grid, words.to(grid.device)

    def next_token_logits(self, gpt: GPT, grid: torch.Tensor, words: torch.Tensor, drop=None) -> torch.Tensor:
        """Teacher-forced logits laid out [B, V, h, w] like the grid (what the token losses take)."""
        if self.fill_order is None:
            logits = gpt(grid.flatten(1), words, drop=drop)
        else:
            logits = gpt.forward_in_order(grid.flatten(1), words, self.fill_order, drop=drop)
        return logits.unflatten(1, grid.shape[1:]).permute(0, 3, 1, 2)

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        grid, words = self.inputs(batch)
        logits = self.next_token_logits(self.gpt, grid, words)  # drops captions at class_dropout_prob
        loss = token_cross_entropy(logits, grid, label_smoothing=self.loss_cfg.label_smoothing)
        logs = {"train/loss": loss.detach(), "train/acc": token_accuracy(logits, grid)}
        now = time.perf_counter()
        if self.last_step_time is not None:
            logs["train/samples_per_s"] = grid.shape[0] / (now - self.last_step_time)
        self.last_step_time = now
        if "skipped" in batch:  # each DataLoader worker reports its own running count
            self.skipped_by_worker[int(batch["worker"])] = int(batch["skipped"])
        logs["train/skipped_samples"] = float(sum(self.skipped_by_worker.values()))
        self.log_dict(logs, batch_size=grid.shape[0])
        self.log("loss", loss.detach(), prog_bar=True, logger=False, batch_size=grid.shape[0])
        return loss

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        if ends_accumulation(self.trainer):  # the optimiser stepped (trainer.accumulate_grad_batches)
            self.update_ema()

    @torch.no_grad()
    def update_ema(self) -> None:
        if self.ema_gpt is None:
            return
        for ema_param, param in zip(self.ema_gpt.parameters(), self.gpt.parameters(), strict=True):
            ema_param.lerp_(param, 1.0 - self.ema_decay)
        for ema_buffer, buffer in zip(self.ema_gpt.buffers(), self.gpt.buffers(), strict=True):
            ema_buffer.copy_(buffer)

    def on_validation_epoch_start(self) -> None:
        self.val_sums = torch.zeros(3, dtype=torch.float64, device=self.device)
        self.sample_batch = None
        self.last_step_time = None  # the next training step's rate must not include validation time

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        grid, words = self.inputs(batch)
        keep = torch.zeros(grid.shape[0], dtype=torch.bool, device=grid.device)  # conditional: no dropout
        logits = self.next_token_logits(self.eval_gpt, grid, words, drop=keep)
        nll = torch.nn.functional.cross_entropy(logits.float(), grid, reduction="sum")
        correct = (logits.argmax(1) == grid).sum()
        self.val_sums += torch.stack([nll.double(), correct.double(), torch.tensor(grid.numel()).to(nll)])
        if self.sample_batch is None and self.samples_cfg is not None:
            count = self.samples_cfg.count
            self.sample_batch = (batch["caption"][:count], grid[:count])

    def on_validation_epoch_end(self) -> None:
        nll, correct, tokens = self.all_gather(self.val_sums).reshape(-1, 3).sum(0).tolist()
        self.log_dict(
            {
                "val/loss": nll / tokens,
                "val/acc": correct / tokens,
                "val/perplexity": math.exp(nll / tokens),
            }
        )
        if self.sample_batch is not None and self.logger is not None:
            folder = Path(self.trainer.log_dir) / "samples"  # log_dir broadcasts: every rank must ask
            if self.trainer.is_global_zero:
                self.log_samples(*self.sample_batch, folder)

    @torch.no_grad()
    def log_samples(self, captions: list[str], grids: torch.Tensor, folder: Path) -> None:
        """Decoded ground-truth tokens (top row) over AR samples for the same captions (bottom row), the rows
        named in the image."""
        settings = OmegaConf.to_container(self.samples_cfg, resolve=True)
        del settings["count"]  # the batch holds that many
        seed = settings.pop("seed")
        vq = VQModel.from_pretrained(self.tokenizer, self.device)
        words = torch.stack([encode_caption(text, MAX_CAPTION_WORDS) for text in captions]).to(self.device)
        generator = torch.Generator(self.device).manual_seed(seed)
        sampler, labels = SamplerConfig(**settings), list(SAMPLE_ROWS)
        if self.fill_window is None:
            sampled = decode_ar(self.eval_gpt, words, sampler, generator, tokenizer=vq).image
        else:  # sampled in the order it is taught
            window = self.fill_window
            sampled = decode_zipar(self.eval_gpt, words, sampler, generator, window, tokenizer=vq).image
            labels[1] = f"ZipAR samples (window {self.fill_window}), same captions"
        rows = [images.float().add(1).div(2).clamp(0, 1) for images in (vq.decode(grids), sampled)]
        grid = labelled_grid(rows, labels)
        path = folder / f"step{self.global_step:06d}.png"
        folder.mkdir(parents=True, exist_ok=True)
        torchvision.utils.save_image(grid, path)
        if isinstance(self.logger, WandbLogger):
            self.logger.log_image(
                "val/samples", [grid], step=self.global_step, caption=[" | ".join(captions)]
            )

    def export(self, folder: Path) -> Path:
        return self.eval_gpt.save_pretrained(folder)
