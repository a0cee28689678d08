"""`mulo-train`: a thin Hydra `main()` around a plain `run(cfg)` that tests call directly."""

from __future__ import annotations

import logging
from pathlib import Path

import hydra
import lightning as L
from lightning.pytorch.loggers import WandbLogger
from mulo_sd.training.accumulation import manual_accumulation
from mulo_sd.training.callbacks import FinalStep
from mulo_sd.training.checkpoints import weights_only_loading
from mulo_sd.training.config import CONFIG_DIR
from mulo_sd.training.datamodule import samples_read
from mulo_sd.training.preemption import stop_on_signals
from mulo_sd.training.run_folder import holding
from mulo_sd.training.run_messages import print_run_end, print_run_start
from mulo_sd.training.wandb_resume import continue_wandb_run
from omegaconf import DictConfig, OmegaConf

log = logging.getLogger(__name__)


def instantiate_group(group: DictConfig | None) -> list:
    """Instantiate every `_target_` entry of a callbacks/logger group (an empty group gives [])."""
    if not group:
        return []
    return [hydra.utils.instantiate(entry) for entry in group.values() if entry and "_target_" in entry]


def prepare_data(data_cfg: DictConfig, trainer_cfg: DictConfig) -> DictConfig:
    """Generate the shards a data config asks for under `generate:` (the testbed's SynthScenes: the training
    shards the trainer's steps read, the whole validation set), pre-tokenise them when it has a
    `pretokenize:` block, and point `train_shards` / `val_shards` at the result (a split whose `generate`
    entry is null keeps the shards it names); return the datamodule's arguments."""
    # throw_on_missing: a '???' value (data.train_shards of LAION) is a clear error, not the string '???'
    data = OmegaConf.to_container(data_cfg, resolve=True, throw_on_missing=True)
    generate = data.pop("generate", None)
    pretokenize = data.pop("pretokenize", None)
    if generate:
        from mulo_sd.data.synthscenes_cache import ensure_synthscenes

        trainer = OmegaConf.to_container(trainer_cfg, resolve=True)
        needed = {"train": samples_read(trainer, data["batch_size"])}  # validation: the whole set
        for split in ("train", "val"):
            if generate[split] is None:  # that split reads the shards its *_shards names
                continue
            data[f"{split}_shards"] = ensure_synthscenes(
                size=generate["size"], needed=needed.get(split), **generate[split]
            )
    if pretokenize:
        from mulo_sd.data.pretokenize import ensure_pretokenized

        outs = {split: pretokenize.pop(split)["out"] for split in ("train", "val")}
        for split, out in outs.items():
            if data.get(f"{split}_shards"):  # no val_shards: no validation set to tokenise
                data[f"{split}_shards"] = ensure_pretokenized(data[f"{split}_shards"], out=out, **pretokenize)
    return OmegaConf.create(data)


DDP_STRATEGIES = ("ddp", "ddp_spawn", "ddp_fork", "ddp_notebook")


def strategy_for(trainer: DictConfig, model: L.LightningModule) -> dict:
    """The trainer's DDP strategy with unused-parameter detection when the model leaves some trainable
    parameters out of a step's loss (`leaves_parameters_unused`: a GAN's discriminator idles until its start
    step, and its own turn leaves the generator out); DDP would otherwise stop at the first such step."""
    strategy = trainer.get("strategy")
    if strategy in DDP_STRATEGIES and getattr(model, "leaves_parameters_unused", False):
        return {"strategy": f"{strategy}_find_unused_parameters_true"}
    return {}


def run(cfg: DictConfig) -> dict[str, float]:
    """Train (or resume) the configured model; export it when `cfg.export` is set. Returns final metrics.
    The run folder stays locked against a second run meanwhile (training/run_folder.py); it is printed when
    the run starts and ends (training/run_messages.py)."""
    print_run_start(cfg.paths.output_dir)
    with holding(cfg.paths.output_dir):
        metrics = train(cfg)
    print_run_end(cfg.paths.output_dir, cfg.get("export"))
    return metrics


def train(cfg: DictConfig) -> dict[str, float]:
    """`run` in its locked run folder."""
    # checkpoints load with torch.load(weights_only=True) unless trusted, so one cannot run code; an older
    # file that needs more is an error naming trust_checkpoint (training/checkpoints.py)
    weights_only = weights_only_loading(cfg.get("ckpt_path"), cfg.get("trust_checkpoint", False))
    L.seed_everything(cfg.seed, workers=True)
    datamodule = hydra.utils.instantiate(prepare_data(cfg.data, cfg.trainer))
    model = hydra.utils.instantiate(cfg.model, loss=cfg.loss, _recursive_=False)
    callbacks = instantiate_group(cfg.get("callbacks"))
    # a manually optimised module accumulates itself: the Trainer gets N only after Lightning's check
    accumulation = manual_accumulation(cfg.trainer, model)
    # a resumed run continues the checkpoint's W&B run (training/wandb_resume.py)
    loggers = instantiate_group(continue_wandb_run(cfg.get("logger"), cfg.get("ckpt_path"), weights_only))
    trainer: L.Trainer = hydra.utils.instantiate(
        cfg.trainer,
        logger=loggers or False,
        callbacks=callbacks if accumulation is None else [*callbacks, accumulation],
        **strategy_for(cfg.trainer, model),
        **({} if accumulation is None else {"accumulate_grad_batches": 1}),
    )
    hyperparameters = {k: v for k, v in OmegaConf.to_container(cfg, resolve=False).items() if k != "hydra"}
    hyperparameters = OmegaConf.to_container(OmegaConf.create(hyperparameters), resolve=True)
    for logger in trainer.loggers:
        logger.log_hyperparams(hyperparameters)
    validated = {}
    with stop_on_signals(trainer):  # SIGTERM / SLURM's requeue signal: checkpoint, exit non-zero
        if cfg.get("validate_first"):
            ckpt_path = cfg.get("ckpt_path")
            validated = _metrics_of(
                trainer.validate(model, datamodule=datamodule, ckpt_path=ckpt_path, weights_only=weights_only)
            )
        trainer.fit(model, datamodule=datamodule, ckpt_path=cfg.get("ckpt_path"), weights_only=weights_only)
        final = next((c for c in trainer.callbacks if isinstance(c, FinalStep)), None)
        if final and final.trained(trainer) and final.validated_step != trainer.global_step:
            validated = _metrics_of(trainer.validate(model, datamodule=datamodule))  # the exported weights'
    # fit starts its metrics afresh: a validation-only run (no steps left) keeps the validation's
    metrics = {k: float(v) for k, v in {**validated, **trainer.callback_metrics}.items()}
    if cfg.get("export") and trainer.is_global_zero:
        folder = model.export(Path(cfg.export))
        log.info("exported %s", folder)
    for logger in trainer.loggers:  # else the next job of a Hydra multirun would log into this W&B run
        if isinstance(logger, WandbLogger):
            logger.experiment.finish()
    return metrics


def _metrics_of(results: list[dict]) -> dict:
    """trainer.validate's metrics; none where validation is switched off (trainer.limit_val_batches=0)."""
    return results[0] if results else {}


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="train")
def main(cfg: DictConfig) -> None:
    metrics = run(cfg)
    for name, value in sorted(metrics.items()):
        print(f"{name:>32s}  {value:.4f}")


if __name__ == "__main__":
    main()
