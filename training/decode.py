"""`mulo-decode`: decode one caption with one method on the testbed models, print the statistics and write
the image. A thin Hydra `main()` around a plain `run(cfg)` that tests call directly.

    mulo-decode method=ar prompt="two red circles left of a blue star on a striped background" out=sample.png
    mulo-decode method=mulo knobs.r=2 knobs.tau=0.1 knobs.k=4
"""

from __future__ import annotations

import logging
from pathlib import Path

import hydra
import torch
from mulo_sd.training.config import CONFIG_DIR
from omegaconf import DictConfig, OmegaConf

from mulo_sd.decode import decode, required_models, tensor_to_pil
from mulo_sd.sampling import SamplerConfig
from mulo_sd.testbed import TESTBED_DIR, load_models

log = logging.getLogger(__name__)


def set_knobs(cfg_knobs: DictConfig | None) -> dict:
    """The knobs the user set: null entries mean 'the method's default' and are left out."""
    knobs = OmegaConf.to_container(cfg_knobs, resolve=True) if cfg_knobs else {}
    return {name: value for name, value in knobs.items() if value is not None}


def format_stats(stats: dict) -> str:
    """Two aligned columns: statistic, value."""
    width = max(len(name) for name in stats)
    lines = []
    for name, value in stats.items():
        text = f"{value:.4f}" if isinstance(value, float) else str(value)
        lines.append(f"{name:>{width}s}  {text}")
    return "\n".join(lines)


def run(cfg: DictConfig) -> dict:
    """Decode `cfg.prompt` with `cfg.method`, write the PNG to `cfg.out`; return the statistics row."""
    if cfg.get("threads"):
        torch.set_num_threads(cfg.threads)
    knobs = set_knobs(cfg.knobs)
    folder = Path(cfg.models) if cfg.get("models") else TESTBED_DIR
    models = load_models(folder, cfg.device, names=required_models(cfg.method, knobs))
    sampler = SamplerConfig(**OmegaConf.to_container(cfg.sampler, resolve=True))
    result = decode(cfg.method, models, [cfg.prompt], knobs, sampler, cfg.seed)
    out = Path(cfg.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tensor_to_pil(result.image[0]).save(out)
    log.info("wrote %s", out)
    return result.stats.as_dict()


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="decode")
def main(cfg: DictConfig) -> None:
    stats = run(cfg)
    print(format_stats(stats))
    print(f"image: {cfg.out}")


if __name__ == "__main__":
    main()
