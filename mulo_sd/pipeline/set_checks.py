"""The checks that a model set's folders fit together, read from their config files before any weights load
(mulo_sd/pipeline/model_set.py): one function per relation, each error naming the role, the file and the
field."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from mulo_sd.llamagen.t5 import t5_feature_width
from mulo_sd.nets.io import CONFIG_NAME
from mulo_sd.pipeline.folder_hints import tar_hint
from mulo_sd.pipeline.roles import GPT_ROLES, MLLM, SAMPLERS, SCALES, TATOK, TEXT_ENCODER
from mulo_sd.tar.files import check_mllm_folder, read_tatok_shape

if TYPE_CHECKING:  # model_set.py imports this module
    from mulo_sd.pipeline.model_set import ModelSet


def _prefix(model_set: ModelSet) -> str:
    return f"model set '{model_set.name}': "


def _where(model_set: ModelSet, role: str) -> str:
    """The role and its config file, as the errors name them."""
    return f"{role} ({model_set.folders[role] / CONFIG_NAME})"


def t5_width(model_set: ModelSet) -> int:
    """d_model of the set's T5 folder, from its config.json; errors name what to put where."""
    return t5_feature_width(model_set.path(TEXT_ENCODER, "the T5 encoder of the set's captions"))


def check_ar_dtoks(model_set: ModelSet, configs: dict) -> None:
    """Raise unless every GPT of a Tar set is an AR-DTok (conditioned on TA-Tok features)."""
    for role, config in configs.items():
        if role in GPT_ROLES and config.cond_type != "tatok":
            raise ValueError(
                f"{_prefix(model_set)}{_where(model_set, role)} has "
                f"cond_type '{config.cond_type}', but a Tar set's GPTs are AR-DTok models conditioned on "
                f"TA-Tok features (cond_type 'tatok'): {tar_hint(role, Path('<folder>'))}"
            )


def check_tar_stage(model_set: ModelSet, configs: dict) -> int:
    """Raise unless the set's MLLM folder is a Qwen2-family LM and its TA-Tok file gives features as wide
    as every AR-DTok's clip projection takes, at a scale with as many codes as their prefix (all read
    without loading weights). Returns that scale: the one the MLLM writes."""
    check_mllm_folder(model_set.path(MLLM, "Tar's MLLM, which writes the TA-Tok tokens of a prompt"))
    tatok = model_set.path(TATOK, "the TA-Tok codebook of the MLLM's tokens")
    shape = read_tatok_shape(tatok)
    scale = 0
    for role, config in configs.items():
        if role not in GPT_ROLES:
            continue
        where = f"{_prefix(model_set)}{_where(model_set, role)}"
        if config.caption_dim != shape.feature_dim:
            raise ValueError(
                f"{where} takes caption_dim {config.caption_dim} (its clip_proj), but the TA-Tok file "
                f"{tatok} gives {shape.feature_dim}-d features: use the AR-DTok trained on this TA-Tok"
            )
        if config.cond_len not in shape.token_counts:
            raise ValueError(
                f"{where} has cond_len {config.cond_len}, but the TA-Tok file {tatok} writes "
                f"{' / '.join(map(str, shape.token_counts))} codes at Tar's scales <S0>..<S2>: convert it "
                f"with `mulo-convert tar-ar-dtok ... --cond-len <one of them>`"
            )
        scale = shape.token_counts.index(config.cond_len)  # one cond_len: check_configs compared them
    return scale


def check_configs(model_set: ModelSet, configs: dict, t5_dim: int | None) -> None:
    """Raise unless the roles' configs fit together (mulo_sd/pipeline/model_set.py's docstring)."""
    gpts = {role: config for role, config in configs.items() if role in GPT_ROLES}
    check_against_vq(model_set, configs)
    if "target" in gpts:
        check_eagle_head(model_set, configs, gpts["target"])
        check_drafter_grids(model_set, gpts)
        check_sampler_vocabularies(model_set, configs, gpts["target"])
        check_sampler_captions(model_set, configs, gpts["target"])
    check_sampler_scales(model_set, configs)
    check_conditions(model_set, gpts)
    check_t5_width(model_set, gpts, t5_dim)


def check_against_vq(model_set: ModelSet, configs: dict) -> None:
    """Every GPT predicts the VQ's token ids; every sampler was trained on the VQ's codebook."""
    vq = configs.get("vq")
    if vq is None:
        return
    prefix, size, dim = _prefix(model_set), vq.codebook_size, vq.codebook_embed_dim
    for role, config in configs.items():
        if role in GPT_ROLES and config.vocab_size != size:
            raise ValueError(
                f"{prefix}{_where(model_set, role)} predicts vocab_size {config.vocab_size} token ids, but "
                f"the vq ({model_set.folders['vq']}) has codebook_size {size}: both must come from one "
                f"tokenizer"
            )
        if role in SAMPLERS and (config.codebook_size, config.code_dim) != (size, dim):
            raise ValueError(
                f"{prefix}{_where(model_set, role)} was trained for codebook_size {config.codebook_size} and "
                f"code_dim {config.code_dim}, but the vq has codebook_size {size} and codebook_embed_dim "
                f"{dim}"
            )


def check_eagle_head(model_set: ModelSet, configs: dict, target) -> None:
    """The EAGLE-2 head was trained for this target's vocabulary, grid and width."""
    if "eagle_head" not in configs:
        return
    head = configs["eagle_head"]
    trained = {f: getattr(head, f) for f in ("vocab_size", "grid_size", "dim")}
    actual = {f: getattr(target, f) for f in trained}
    if trained != actual:
        raise ValueError(
            f"{_prefix(model_set)}{_where(model_set, 'eagle_head')} was trained for a target with "
            f"{trained}; the target has {actual}"
        )


def check_drafter_grids(model_set: ModelSet, gpts: dict) -> None:
    """Each drafter decodes the target's grid over its r, with the target's vocabulary."""
    prefix, target = _prefix(model_set), gpts["target"]
    height, width = target.grid_size
    for role, config in gpts.items():
        r = SCALES.get(role)
        if r is None:
            continue
        wanted = (height // r, width // r)
        if height % r or width % r or tuple(config.grid_size) != wanted:
            what = "the target's grid" if r == 1 else f"the target's {height}x{width} grid over r={r}"
            raise ValueError(
                f"{prefix}{_where(model_set, role)} has grid_size {list(config.grid_size)}, but {what} is "
                f"{list(wanted)}: a {role} decodes {'the same' if r == 1 else f'1/{r}'} of the target's "
                f"resolution"
            )
        if config.vocab_size != target.vocab_size:
            raise ValueError(
                f"{prefix}{_where(model_set, role)} has vocab_size {config.vocab_size}, the target "
                f"{target.vocab_size}"
            )


def check_sampler_vocabularies(model_set: ModelSet, configs: dict, target) -> None:
    """Every sampler's codebook is the target's vocabulary."""
    for role in SAMPLERS:
        if role in configs and configs[role].codebook_size != target.vocab_size:
            raise ValueError(
                f"{_prefix(model_set)}{_where(model_set, role)} has codebook_size "
                f"{configs[role].codebook_size}, but the target predicts {target.vocab_size} token ids"
            )


def check_sampler_captions(model_set: ModelSet, configs: dict, target) -> None:
    """An up-sampler that reads the caption reads it as the target takes it: word ids of the target's
    caption vocabulary, or feature rows of its caption_dim."""
    for role in ("upsampler_r2", "upsampler_r4"):
        condition = getattr(configs.get(role), "condition", "none")
        if condition == "none":
            continue
        config, where = configs[role], f"{_prefix(model_set)}{_where(model_set, role)}"
        if condition == "words":
            fits, wanted = target.cond_type == "words", f"word ids of {config.condition_vocab} words"
            fits = fits and target.cond_vocab_size == config.condition_vocab
        else:
            fits, wanted = target.cond_type in ("t5", "tatok"), f"{config.condition_dim}-d caption features"
            fits = fits and target.caption_dim == config.condition_dim
        if not fits:
            raise ValueError(
                f"{where} reads the caption as {wanted}, but the target takes cond_type "
                f"'{target.cond_type}' (cond_vocab_size {target.cond_vocab_size}, caption_dim "
                f"{target.caption_dim}): train the up-sampler against this target"
            )


def check_sampler_scales(model_set: ModelSet, configs: dict) -> None:
    """Every sampler works at the r its role names."""
    for role in SAMPLERS:
        if role in configs and configs[role].r != SCALES[role]:
            raise ValueError(
                f"{_prefix(model_set)}{_where(model_set, role)} has r={configs[role].r}; role {role} needs "
                f"r={SCALES[role]}"
            )


def check_sampler_codebooks(model_set: ModelSet, tokenizer, samplers: dict) -> None:
    """Every loaded sampler stores the loaded VQ's codebook vectors (weights, not configs)."""
    for role, sampler in samplers.items():
        try:
            sampler.check_tokenizer(tokenizer)
        except ValueError as error:
            raise ValueError(f"{_prefix(model_set)}{role} ({model_set.folders[role]}): {error}") from None


def check_conditions(model_set: ModelSet, gpts: dict) -> None:
    """One condition kind and prefix for every GPT: they decode one caption together."""
    prefix = _prefix(model_set)
    kinds = {role: config.cond_type for role, config in gpts.items()}
    if len(set(kinds.values())) > 1:
        raise ValueError(
            f"{prefix}the GPTs take different conditions {kinds}; they decode one caption together"
        )
    for field_name in ("cond_len", "caption_dim", "cond_vocab_size"):
        values = {role: getattr(config, field_name) for role, config in gpts.items()}
        if len(set(values.values())) > 1:
            raise ValueError(
                f"{prefix}the GPTs disagree on {field_name} {values}: one encoded caption conditions them "
                f"all (convert them with the same --cls-token-num)"
            )


def check_t5_width(model_set: ModelSet, gpts: dict, t5_dim: int | None) -> None:
    """The T5-conditioned GPTs take features as wide as the set's text encoder gives (None: no encoder)."""
    if t5_dim is None:
        return
    for role, config in gpts.items():
        if config.cond_type == "t5" and config.caption_dim != t5_dim:
            raise ValueError(
                f"{_prefix(model_set)}{_where(model_set, role)} takes caption_dim {config.caption_dim}, but "
                f"the text_encoder gives {t5_dim}-d T5 features (d_model): use the T5 the GPT was trained "
                f"with (LlamaGen's: flan-t5-xl)"
            )
