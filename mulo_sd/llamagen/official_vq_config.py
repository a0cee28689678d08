"""The VQConfig fields of a LlamaGen VQ file (official.py), by the rules of official_configs.py: the
architecture from the weights' shapes, the quantiser's settings from the stored training args, then the
caller's overrides (one that contradicts the args is an error)."""

from __future__ import annotations

import torch

from mulo_sd.llamagen.official import OfficialCheckpoint, OfficialCheckpointError
from mulo_sd.llamagen.official_configs import ConfigFields, count_indexed, tensor_shape

LLAMAGEN_VQ_MULTS = {"VQ-16": [1, 1, 2, 2, 4], "VQ-8": [1, 2, 2, 4]}
# LlamaGen VQ training args that are VQConfig fields of the same name
VQ_ARGS = (
    "codebook_size",
    "codebook_embed_dim",
    "codebook_l2_norm",
    "commit_loss_beta",
    "entropy_loss_ratio",
)


def vq_fields(checkpoint: OfficialCheckpoint, state: dict[str, torch.Tensor], **overrides) -> ConfigFields:
    """VQConfig fields of a LlamaGen VQ file: the architecture from the shapes, the quantiser's settings from
    its training args, then `overrides` (VQConfig fields; one that contradicts the args is an error)."""
    checkpoint.expect("llamagen-vq")
    path, out = checkpoint.path, ConfigFields()
    _architecture(state, path, out)
    name = checkpoint.settings.get("vq_model")
    if name is not None and LLAMAGEN_VQ_MULTS.get(name) != out.values["encoder_ch_mult"]:
        raise OfficialCheckpointError(
            f"{path}: args.vq_model is {name!r} but the weights have channel multipliers "
            f"{out.values['encoder_ch_mult']} (LlamaGen's: {LLAMAGEN_VQ_MULTS})"
        )
    stored = _training_args(checkpoint, out)
    for name, value in overrides.items():
        if name in stored and stored[name] != value:
            raise OfficialCheckpointError(
                f"{path}: {name}={value!r} disagrees with the file's training setting "
                f"args.{name}={stored[name]!r}"
            )
        out.set(name, value, "given")
    return out


def _architecture(state, path, out: ConfigFields) -> None:
    """Codebook, channel widths and depths, as the weights' shapes fix them."""
    size, dim = tensor_shape(state, "quantize.embedding.weight", path)
    out.set("codebook_size", size, "weights: quantize.embedding.weight")
    out.set("codebook_embed_dim", dim, "weights: quantize.embedding.weight")
    out.set("codebook_show_usage", "quantize.codebook_used" in state, "weights: quantize.codebook_used")
    ch = tensor_shape(state, "encoder.conv_in.weight", path)[0]
    out.set("ch", ch, "weights: encoder.conv_in.weight")
    out.set(
        "z_channels",
        tensor_shape(state, "encoder.conv_out.weight", path)[0],
        "weights: encoder.conv_out.weight",
    )
    levels = count_indexed(state, r"encoder\.conv_blocks\.(\d+)\.")
    widths = [
        tensor_shape(state, f"encoder.conv_blocks.{i}.res.0.conv1.weight", path)[0] for i in range(levels)
    ]
    out.set("encoder_ch_mult", [w // ch for w in widths], "weights: encoder.conv_blocks.*.res.0.conv1")
    # the decoder's blocks run from the lowest resolution up
    up = count_indexed(state, r"decoder\.conv_blocks\.(\d+)\.")
    widths = [
        tensor_shape(state, f"decoder.conv_blocks.{up - 1 - i}.res.0.conv1.weight", path)[0]
        for i in range(up)
    ]
    out.set("decoder_ch_mult", [w // ch for w in widths], "weights: decoder.conv_blocks.*.res.0.conv1")
    out.set(
        "num_res_blocks",
        count_indexed(state, r"encoder\.conv_blocks\.0\.res\.(\d+)\."),
        "weights: encoder res blocks",
    )


def _training_args(checkpoint: OfficialCheckpoint, out: ConfigFields) -> dict:
    """The VQ_ARGS the file stores, set on `out`; one that contradicts the weights is an error."""
    path, stored = checkpoint.path, {}
    for arg in VQ_ARGS:
        if arg in checkpoint.settings:
            stored[arg] = checkpoint.settings[arg]
            if arg in out.values and out.values[arg] != stored[arg]:
                raise OfficialCheckpointError(
                    f"{path}: args.{arg} is {stored[arg]!r} but the weights give {out.values[arg]!r}"
                )
            out.set(arg, stored[arg], f"checkpoint args.{arg}")
    return stored
