"""`mulo-decode`: decode one caption with one method on a model set (conf/models/,
mulo_sd/pipeline/model_set.py) through `MuLoPipeline` (mulo_sd/pipeline/mulo_pipeline.py), print the
statistics and write the image (`save_tokens=true`: its token grid too, an int64 [h, w] array in
<out without its suffix>.tokens.npy). A thin Hydra `main()` around a plain `run(cfg)` that tests call
directly.

    mulo-decode method=ar prompt="two red circles left of a blue star on a striped background" out=sample.png
    mulo-decode method=mulo prompt="a red circle on a striped background"   # the recommended knobs
    mulo-decode method=mulo knobs.r=4 knobs.l=1 knobs.tau=0.05 knobs.upsampler=pixel   # MuLo-SD 4x
    mulo-decode models=llamagen_t2i_xl_512 models.root=/ckpts method=mulo prompt="a corgi on a beach"
    mulo-decode models=tar_1024 models.root=/ckpts method=mulo prompt="a corgi on a beach" compare_ar=true

The prompt, the method's models (the set names a folder for each), the output path and the seed are checked
before any model is loaded; the models' configs are checked against each other before any weights are read. A
Tar set (targets conditioned on TA-Tok features) decodes in two stages, MLLM then AR-DTok, and reports each
stage's statistics under its prefix (mulo_sd/pipeline/tar_decode.py). `compare_ar=true` also decodes with
plain AR under the same condition and reports the method's speedup (on a Tar set: of the AR-DTok stage and end
to end).
"""

from __future__ import annotations

import logging
from pathlib import Path

import hydra
import numpy as np
import torch
from mulo_sd.training.config import CONFIG_DIR
from mulo_sd.training.seeds import check_seed
from omegaconf import DictConfig, OmegaConf

from mulo_sd.decoding.sampling import SamplerConfig
from mulo_sd.pipeline.mulo_pipeline import MuLoPipeline
from mulo_sd.testbed.captions import encode_caption

log = logging.getLogger(__name__)

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")  # PIL picks the format from the suffix
UNSET = "default"  # a knob's value in conf/decode/default.yaml until the user sets it


def set_knobs(cfg_knobs: DictConfig | None) -> dict:
    """The knobs the user set: entries left at UNSET keep the method's default and are left out (null is a
    value: None, e.g. serial drafting)."""
    knobs = OmegaConf.to_container(cfg_knobs, resolve=True) if cfg_knobs else {}
    return {name: value for name, value in knobs.items() if value != UNSET}


def check_prompt(prompt, unconditional: bool, words: bool = True) -> str:
    """The caption to decode. An empty one would decode the model's all-padding caption, which is neither
    a caption nor its unconditional distribution: it takes unconditional=true, which takes an empty one.
    `words`: the target reads caption word ids (the testbed), so every word must be in their vocabulary."""
    text = "" if prompt is None else str(prompt)
    if unconditional and text.strip():
        raise ValueError(
            f"unconditional=true samples without a caption, but prompt={text!r} is given: set prompt='' "
            f"or drop unconditional=true"
        )
    if not unconditional and not text.strip():
        raise ValueError(
            f"prompt is empty ({text!r}): give a caption, e.g. prompt='a red circle on a noisy background', "
            f"or ask for an unconditional sample with unconditional=true"
        )
    if words and not unconditional:
        encode_caption(text)  # unknown words fail here, before any model is loaded
    return text


def prepare_output(out) -> Path:
    """The image path `out`, checked, with its folder created, before anything is decoded."""
    path = Path(str(out))
    if path.is_dir():
        raise ValueError(
            f"out={out} is an existing directory: give an image file, e.g. out={path / 'sample.png'}"
        )
    if path.suffix.lower() not in IMAGE_SUFFIXES:
        raise ValueError(f"out={out} must end in one of {list(IMAGE_SUFFIXES)}: the suffix picks the format")
    blocking = next((p for p in (path.parent, *path.parent.parents) if p.exists() and not p.is_dir()), None)
    if blocking is not None:
        raise ValueError(f"out={out}: its folder {path.parent} cannot be created: {blocking} is a file")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ValueError(f"out={out}: its folder {path.parent} cannot be created ({error})") from None
    return path


def format_stats(stats: dict) -> str:
    """Two aligned columns: statistic, value. Statistics a method does not have (an empty value:
    `accepted_per_cycle_mean` and `islands_per_cycle` without draft cycles) are left out."""
    stats = {name: value for name, value in stats.items() if value not in ("", None)}
    width = max(len(name) for name in stats)
    lines = []
    for name, value in stats.items():
        text = f"{value:.4f}" if isinstance(value, float) else str(value)
        lines.append(f"{name:>{width}s}  {text}")
    return "\n".join(lines)


def tokens_path(out: Path) -> Path:
    """Where save_tokens=true writes the token grid of the image `out`: beside it, sample.tokens.npy."""
    return out.with_suffix(".tokens.npy")


def run(cfg: DictConfig) -> dict:
    """Decode `cfg.prompt` with `cfg.method` through MuLoPipeline, write the image to `cfg.out` (and with
    save_tokens=true its token grid beside it); return the statistics row."""
    unconditional = bool(cfg.get("unconditional"))
    pipeline = MuLoPipeline.from_config(OmegaConf.to_container(cfg.models, resolve=True), cfg.device)
    kind = pipeline.condition_kind
    if unconditional and kind == "tatok":
        raise ValueError(
            f"unconditional=true: model set '{pipeline.model_set.name}' decodes the TA-Tok tokens its MLLM "
            f"writes for a prompt, so it takes a prompt"
        )
    prompt = check_prompt(cfg.prompt, unconditional, kind == "words")
    out = prepare_output(cfg.out)
    seed = check_seed(cfg.seed, "seed")
    if cfg.get("threads"):
        torch.set_num_threads(cfg.threads)
    sampler = OmegaConf.to_container(cfg.sampler, resolve=True)
    if unconditional:  # guided logits u + 0 * (c - u): the unconditional branch (the CFG null caption) alone
        sampler["cfg_scale"] = 0.0
    # the method, its knobs (over the set's own, e.g. tar_1024's MuLo-SD r=4) and the set's folders for
    # them are checked before any model loads
    output = pipeline(prompt, cfg.method, seed, sampler=SamplerConfig(**sampler),
                      compare_ar=bool(cfg.get("compare_ar")), compile=bool(cfg.get("compile")),
                      **set_knobs(cfg.knobs))  # fmt: skip
    output.images[0].save(out)
    log.info("wrote %s", out)
    if cfg.get("save_tokens"):
        np.save(tokens_path(out), output.tokens[0].numpy())
        log.info("wrote %s", tokens_path(out))
    return output.rows[0]


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="decode")
def main(cfg: DictConfig) -> None:
    stats = run(cfg)
    print(format_stats(stats))
    print(f"image: {cfg.out}")
    if cfg.get("save_tokens"):
        print(f"tokens: {tokens_path(Path(str(cfg.out)))}")


if __name__ == "__main__":
    main()
