"""`mulo-convert`: official LlamaGen / Tar AR-DTok checkpoint files -> model folders (config.json +
model.safetensors) that `VQModel.from_pretrained` / `GPT.from_pretrained` load.

    mulo-convert llamagen-vq  vq_ds16_t2i.pt        /ckpts/vq_ds16_t2i
    mulo-convert llamagen-gpt t2i_XL_stage1_256.pt  /ckpts/t2i_XL_256 --image-size 256
    mulo-convert llamagen-gpt t2i_XL_stage2_512.pt  /ckpts/t2i_XL_512 --image-size 512
    mulo-convert tar-ar-dtok  ar_dtok_lp_256px.pth  /ckpts/tar_ar_dtok_256

Settings the file stores (LlamaGen's pickled training `args`, Tar's model spec) are read from it; flags fill
in what it does not store (a flag that contradicts the file is an error); the weights' shapes give depth,
widths and vocabulary; what is left takes LlamaGen's script defaults (--cls-token-num 120,
--downsample-size 16). The config is printed with the origin of each value. `--weights ema` converts the
EMA weights of a training checkpoint. Files are unpickled with tensors and argparse.Namespace only;
`--trust-pickle` lifts that for files from a trusted source (mulo_sd/llamagen/official.py).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mulo_sd.llamagen.official import FAMILIES, WEIGHT_SETS, OfficialCheckpointError, read_official
from mulo_sd.llamagen.official_configs import GPT_SETTINGS, ConfigFields, gpt_fields
from mulo_sd.llamagen.official_models import gpt_from_official, vq_from_official
from mulo_sd.llamagen.official_vq_config import vq_fields
from mulo_sd.nets.gpt import GPT
from mulo_sd.nets.gpt_config import GPTConfig
from mulo_sd.nets.io import CONFIG_NAME, WEIGHTS_NAME
from mulo_sd.nets.vq import VQModel

SETTING_HELP = {
    "model_size": "LlamaGen GPT-B/L/XL/XXL/XXXL/1B/3B/7B (or B, XL ...); Tar llama-abs-S ... llama-abs-XXXL",
    "image_size": "image size in px it was trained at (256 for stage 1, 512 for stage 2)",
    "downsample_size": "VQ downsampling factor (default 16)",
    "cls_token_num": "condition slots it was trained with (LlamaGen t2i default 120; Tar e.g. 729)",
    "num_classes": "c2i classes (default 1000)",
    "n_head": "attention heads, for architectures outside the size tables",
    "max_seq_len": "Tar: image tokens per sequence (h*w)",
    "cond_len": "Tar: prefix length to decode with (default: cls_token_num; Tar's other scales: 169, 81)",
}


def convert(
    family: str,
    source: str | Path,
    out: str | Path,
    *,
    weights: str = "model",
    trust_pickle: bool = False,
    force: bool = False,
    **settings,
) -> tuple[VQModel | GPT, ConfigFields]:
    """Convert the official file `source` of `family` (a key of official.FAMILIES) into the folder `out`;
    returns the model and its config fields with their origins. `settings`: GPT_SETTINGS[family]."""
    out = Path(out)
    if not force and ((out / CONFIG_NAME).exists() or (out / WEIGHTS_NAME).exists()):
        raise FileExistsError(f"{out} already holds a model; pass --force (force=True) to overwrite it")
    checkpoint = read_official(source, trust_pickle=trust_pickle)
    checkpoint.expect(family)
    state = checkpoint.weights(weights)
    if family == "llamagen-vq":
        if settings:
            raise TypeError(f"llamagen-vq reads every setting from the file, got {sorted(settings)}")
        fields = vq_fields(checkpoint, state)
        model = vq_from_official(checkpoint, weights=weights)
    else:
        fields = gpt_fields(checkpoint, state, **settings)
        model = gpt_from_official(checkpoint, GPTConfig(**fields.values), weights=weights)
    model.save_pretrained(out)
    return model, fields


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mulo-convert", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="family", required=True)
    for family, what in FAMILIES.items():
        command = commands.add_parser(family, help=f"convert {what} checkpoint", description=__doc__,
                                      formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
        command.add_argument("source", help="the official .pt / .pth file")
        command.add_argument("out", help="output folder (config.json + model.safetensors)")
        command.add_argument(
            "--weights", choices=WEIGHT_SETS, default="model", help="weight set (default model)"
        )
        command.add_argument(
            "--trust-pickle",
            action="store_true",
            help="unpickle classes other than tensors and argparse.Namespace (runs code from the file)",
        )
        command.add_argument("--force", action="store_true", help="overwrite a model already in OUT")
        for name in GPT_SETTINGS.get(family, ()):
            kind = str if name == "model_size" else int
            command.add_argument(f"--{name.replace('_', '-')}", dest=name, type=kind, help=SETTING_HELP[name])
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    settings = {name: getattr(args, name) for name in GPT_SETTINGS.get(args.family, ())}
    settings = {name: value for name, value in settings.items() if value is not None}
    try:
        model, fields = convert(
            args.family,
            args.source,
            args.out,
            weights=args.weights,
            trust_pickle=args.trust_pickle,
            force=args.force,
            **settings,
        )
    except (OfficialCheckpointError, ValueError, TypeError, FileNotFoundError, FileExistsError) as error:
        raise SystemExit(f"mulo-convert {args.family}: {error}") from None
    parameters = sum(p.numel() for p in model.parameters())
    print(f"{args.source}: {FAMILIES[args.family]}, '{args.weights}' weights, {parameters:,} parameters")
    print(f"config ({type(model.config).__name__}):\n{fields.describe()}")
    print(f"wrote {Path(args.out) / CONFIG_NAME} and {Path(args.out) / WEIGHTS_NAME}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
