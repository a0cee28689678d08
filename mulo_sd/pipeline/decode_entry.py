"""One entry point over the decoding methods on a model set (mulo_sd/pipeline/model_set.py): caption text in,
DecodeResult out. The set's condition (testbed word ids, or LlamaGen's T5 features and mask) is built by
`Models.condition` and handed to the method with its mask; guidance's unconditional branch is the target's
own (GPT.start: the uncond_embedding under the caption's mask, as LlamaGen's generate).

    result = decode("mulo", models, ["a red star on a noisy background"], {}, SamplerConfig(cfg_scale=2.0),
                    seed=0)  # the recommended knobs; {"r": 4, "tau": 0.05} changes those two

Knobs are the method function's own keyword arguments (`method_knobs(method)` lists them with their
defaults: `RECOMMENDED` over the function's own), plus, for `mulo`, the ones that pick its models:
- r: 2 or 4, the scale between target and drafter (drafter_r2 / drafter_r4);
- upsampler: 'latent' (the learned upsampler_r{r}) or 'pixel' (VQ-decode, resize, VQ-encode);
- downsampler: 'latent' or 'pixel'; None: the same kind as the up-sampler. Only the modes that draft from
  down-sampled accepted rows use one (methods/mulo_checks.py `uses_downsampler`: rejection='raster' or a
  rows_per_cycle); the others load none, so a set without downsampler_r{r} decodes them;
- pixel_mode: the interpolation of the pixel up-sampler (pixel_samplers.MODES), or 'sr': the set's
  super-resolution network for r (role sr_x{r}: a state-dict file spandrel builds, in the set's dtype;
  mulo_sd/nets/sr_network.py, docs/super_resolution.md).
A knob that the chosen mode ignores (`IGNORED`, e.g. `l` with rejection='raster') is an error when it is
given, so no setting is dropped silently. `lantern` drafts with drafter_small (a smaller same-resolution
model; a set without one is an error naming the role); `eagle2` drafts with the set's eagle_head. Every
call draws its randomness from its own torch.Generator seeded with `seed`, so a (method, knobs, prompts,
seed) decode repeats exactly. `compile=True` runs the AR models' decoding steps through torch.compile'd
graphs (mulo_sd/nets/compiled.py: the same tokens; the first decodes of each shape pay the compilation);
`compile="every_width"` compiles every step width of a shape at its first decode, so later decodes of that
shape compile nothing (what timed evaluation runs want).
"""

from __future__ import annotations

import inspect
import typing
import warnings
import weakref

import torch
from PIL import Image

from mulo_sd.decoding.methods import (
    DecodeResult,
    decode_ar,
    decode_eagle2,
    decode_lantern,
    decode_mulo,
    decode_zipar,
)
from mulo_sd.decoding.methods.mulo_checks import REJECTIONS, uses_downsampler
from mulo_sd.decoding.neighbours import codebook_neighbours
from mulo_sd.decoding.sampling import SamplerConfig
from mulo_sd.nets.compiled import compiled
from mulo_sd.nets.dtypes import resolve_dtype
from mulo_sd.nets.pixel_samplers import MODES, PixelDownsampler, PixelUpsampler
from mulo_sd.pipeline.model_set import Models
from mulo_sd.pipeline.roles import SR_NETWORKS
from mulo_sd.testbed.captions import encode_caption

FUNCTIONS = {
    "ar": decode_ar,
    "zipar": decode_zipar,
    "lantern": decode_lantern,
    "eagle2": decode_eagle2,
    "mulo": decode_mulo,
}
METHODS = tuple(FUNCTIONS)
REQUIRED = inspect.Parameter.empty
SCALES = (2, 4)
SAMPLER_KINDS = ("latent", "pixel")
SR_MODE = "sr"  # pixel_mode: the set's super-resolution network
PIXEL_MODES = (*MODES, SR_MODE)
SR_PURPOSE = "knobs.pixel_mode=sr enlarges with the set's super-resolution network for r"
LANTERN_DRAFTER = "LANTERN drafts with a smaller model at the target's resolution"
EAGLE_HEAD = "EAGLE-2 drafts with a feature-level head trained for the target"
DOWNSAMPLER = (
    "MuLo-SD with rejection=raster or a rows_per_cycle (the testbed set's default: 4) drafts from "
    "down-sampled accepted rows; local rejection in one cycle (rows_per_cycle=null) needs none, and "
    "downsampler=pixel needs no trained one"
)
# role -> why a decode needs it, for the error when a set lacks it
PURPOSES = {
    "drafter_small": LANTERN_DRAFTER,
    "eagle_head": EAGLE_HEAD,
    "downsampler_r2": DOWNSAMPLER,
    "downsampler_r4": DOWNSAMPLER,
}
# arguments of the method functions that decode() fills in itself
_NOT_KNOBS = {
    "model", "target", "drafter", "upsampler", "downsampler", "cond", "sampler", "generator", "neighbours",
    "cond_mask", "tokenizer", "head",
}  # fmt: skip
_MULO_MODEL_KNOBS = {"r": REQUIRED, "upsampler": "latent", "downsampler": None, "pixel_mode": "bicubic"}
# The defaults of `decode`, `mulo-decode` and MuLoPipeline: the best shipped setting of each method on the
# testbed's dev prompts, judged on every quality measure (docs/results.md, "How the defaults were chosen"),
# over the method functions' own defaults. mulo: the typical accept rule at tau=0.02, l=0, ZipAR window 1 for
# drafting and islands, r=2 (r=4: the same knobs); lantern: delta=0.4, 4 drafts, k=64 pooled codes
# (LANTERN's 1000 of LlamaGen's 16384, as a share of the testbed's 1024); zipar: window 4, its matched-quality
# setting; eagle2: exact at every depth, so the fastest tree, depth 1 with 8 nodes (docs/eagle2.md section 7:
# 0.74x AR against 0.36x at depth 5).
RECOMMENDED = {
    "zipar": {"window": 4},
    "eagle2": {"depth": 1, "top_k": 8, "total_tokens": 8},
    "lantern": {"k": 64, "delta": 0.4, "draft_len": 4},
    "mulo": {
        "r": 2,
        "tau": 0.02,
        "accept_rule": "typical",
        "k": 4,
        "l": 0,
        "draft_window": 1,
        "island_zipar_window": 1,
    },
}
# method -> knob -> (the knob that selects the mode, its values under which the knob is ignored, what the
# knob is): giving such a knob in such a mode is an error (methods/mulo.py).
_NO_ISLANDS = "which rejection='raster' does not form"
IGNORED = {
    "mulo": {
        "l": ("rejection", ("naive", "raster"), "the local expansion radius of rejection='local'"),
        "island_zipar_window": ("rejection", ("raster",), f"the ZipAR window inside islands, {_NO_ISLANDS}"),
        "refresh_after_resample": (
            "rejection",
            ("raster",),
            f"a refresh after island resampling, {_NO_ISLANDS}",
        ),
        "parallel": ("rejection", ("raster",), f"how islands are batched, {_NO_ISLANDS}"),
        "pixel_mode": ("upsampler", ("latent",), "the interpolation of upsampler='pixel'"),
        "draft_temperature": ("upsampler", ("pixel",), "a draft sampled from a learned up-sampler's logits"),
    }
}


def check_method(method: str) -> None:
    if method not in FUNCTIONS:
        raise ValueError(f"unknown decoding method '{method}'; choose one of {list(METHODS)}")


def method_knobs(method: str) -> dict[str, object]:
    """Knob name -> default (REQUIRED: the caller must give it) of `method`."""
    check_method(method)
    parameters = inspect.signature(FUNCTIONS[method]).parameters
    knobs = {name: p.default for name, p in parameters.items() if name not in _NOT_KNOBS}
    if method == "mulo":
        knobs = {**_MULO_MODEL_KNOBS, **knobs}
    return {**knobs, **RECOMMENDED.get(method, {})}


def resolve_knobs(method: str, knobs: dict) -> dict[str, object]:
    """Every knob of `method` with its value: `knobs` (the ones the caller gives) over the defaults. Raises
    on unknown or missing knobs, on given knobs that the chosen mode ignores (`IGNORED`) and on bad model
    or mode choices (the method function checks the ranges of the rest)."""
    accepted = method_knobs(method)
    unknown = sorted(set(knobs) - set(accepted))
    if unknown:
        raise ValueError(f"unknown knob(s) {unknown} for method '{method}'; it takes {sorted(accepted)}")
    hints = typing.get_type_hints(FUNCTIONS[method])
    nullable = {name for name in accepted if _admits_none(hints.get(name))}
    if method == "mulo":
        nullable.add("downsampler")
    null = sorted(name for name, value in knobs.items() if value is None and name not in nullable)
    if null:
        can = f" (only {sorted(nullable)} can)" if nullable else ""
        raise ValueError(f"knob(s) {null} of method '{method}' cannot be null{can}")
    resolved = {**accepted, **knobs}
    missing = sorted(name for name, value in resolved.items() if value is REQUIRED)
    if missing:
        raise ValueError(f"method '{method}' needs knob(s) {missing} (e.g. knobs.{missing[0]}=...)")
    if method == "mulo":
        if resolved["r"] not in SCALES:
            r = resolved["r"]
            raise ValueError(f"knob r must be one of {SCALES} (the drafter scales of a model set), got {r!r}")
        if resolved["downsampler"] is None:
            resolved["downsampler"] = resolved["upsampler"]
        for name in ("upsampler", "downsampler"):
            if resolved[name] not in SAMPLER_KINDS:
                raise ValueError(f"knob {name} must be one of {SAMPLER_KINDS}, got '{resolved[name]}'")
        if resolved["pixel_mode"] not in PIXEL_MODES:
            raise ValueError(f"knob pixel_mode must be one of {PIXEL_MODES}, got '{resolved['pixel_mode']}'")
        if resolved["rejection"] not in REJECTIONS:
            raise ValueError(f"knob rejection must be one of {REJECTIONS}, got '{resolved['rejection']}'")
    for name, (mode, ignoring, purpose) in IGNORED.get(method, {}).items():
        if name in knobs and resolved[mode] in ignoring:
            raise ValueError(
                f"knob {name} does not apply with {mode}='{resolved[mode]}': it is {purpose}; leave it unset "
                f"or choose another {mode}"
            )
    return resolved


def _admits_none(hint) -> bool:
    return type(None) in typing.get_args(hint)


def required_models(method: str, knobs: dict) -> list[str]:
    """Model roles (roles.MODEL_CLASSES) that `decode(method, ..., knobs)` uses; a target conditioned on
    T5 features brings the set's text encoder with it (model_set.load_model_set)."""
    knobs = resolve_knobs(method, knobs)
    names = ["vq", "target"]
    if method == "lantern":
        names.append("drafter_small")
    if method == "eagle2":
        names.append("eagle_head")
    if method == "mulo":
        r = knobs["r"]
        names.append(f"drafter_r{r}")
        if knobs["upsampler"] == "latent":
            names.append(f"upsampler_r{r}")
        if knobs["downsampler"] == "latent" and _uses_downsampler(knobs):
            names.append(f"downsampler_r{r}")
    return names


def _uses_downsampler(knobs: dict) -> bool:
    return uses_downsampler(knobs["rejection"], knobs["rows_per_cycle"])


_neighbour_tables: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def neighbour_table(tokenizer, k: int) -> torch.Tensor:
    """The [V, >= k] codebook neighbour table of `tokenizer`, built once per tokenizer (rebuilt only when a
    larger k is asked for)."""
    table = _neighbour_tables.get(tokenizer)
    if table is None or table.shape[1] < k:
        table = codebook_neighbours(tokenizer.codebook.detach(), k)
        _neighbour_tables[tokenizer] = table
    return table


def caption_condition(target, prompts: list[str]) -> torch.Tensor:
    """Caption word ids [B, cond_len] of `prompts` on a word-conditioned target's device (the testbed's);
    `Models.condition` gives any set's condition, T5 features included."""
    if not prompts or not all(isinstance(p, str) for p in prompts):
        raise ValueError(f"prompts must be a non-empty list of caption strings, got {prompts!r}")
    if target.config.cond_type != "words":
        kind = target.config.cond_type
        raise ValueError(f"caption word ids need a target with cond_type 'words', not '{kind}'")
    return torch.stack([encode_caption(p, target.config.cond_len) for p in prompts]).to(target.device)


def decode(
    method: str,
    models: Models,
    prompts: list[str],
    knobs: dict,
    sampler: SamplerConfig,
    seed: int | list[int],
    condition: tuple[torch.Tensor, torch.Tensor | None] | None = None,
    compile: bool | str = False,
) -> DecodeResult:
    """Decode one image per prompt with `method` (module docstring); the batch is decoded together.
    `condition`: (cond, cond_mask) to decode under instead of `Models.condition(prompts)` (Tar's TA-Tok
    features, which its first stage writes: mulo_sd/pipeline/tar_decode.py). `compile`: the target and
    drafter decode through compiled graphs (`compiled_model`); the method itself is unchanged."""
    knobs = resolve_knobs(method, knobs)
    tokenizer = models.require("vq")
    target = compiled_model(models.require("target"), compile)
    cond, cond_mask = models.condition(prompts) if condition is None else condition
    generator = (  # a list of seeds: one generator per image, decoded together (docs/batching.md)
        torch.Generator(device=target.device).manual_seed(seed)
        if isinstance(seed, int)
        else [torch.Generator(device=target.device).manual_seed(one) for one in seed]
    )
    common = dict(cond=cond, cond_mask=cond_mask, sampler=sampler, generator=generator, tokenizer=tokenizer)
    if method == "ar":
        return decode_ar(target, **common)
    if method == "zipar":
        return decode_zipar(target, window=knobs["window"], **common)
    if method == "lantern":
        drafter = compiled_model(models.require("drafter_small", LANTERN_DRAFTER), compile)
        neighbours = neighbour_table(tokenizer, knobs["k"])
        return decode_lantern(target, drafter, neighbours=neighbours, **knobs, **common)
    if method == "eagle2":
        return decode_eagle2(target, models.require("eagle_head", EAGLE_HEAD), **knobs, **common)
    r, up, down, mode = (knobs.pop(name) for name in ("r", "upsampler", "downsampler", "pixel_mode"))
    drafter = models.require(f"drafter_r{r}", f"MuLo-SD's drafter at the target's resolution / {r}")
    drafter = compiled_model(drafter, compile)
    upsampler = models.require(f"upsampler_r{r}") if up == "latent" else pixel_upsampler(models, r, mode)
    downsampler = _downsampler(models, r, down, knobs)
    neighbours = neighbour_table(tokenizer, knobs["k"])
    return decode_mulo(target, drafter, upsampler, downsampler, neighbours=neighbours, **knobs, **common)


COMPILE_MODES = (False, True, "every_width")


def compiled_model(model, compile: bool | str):
    """`model` itself, or with `compile` (COMPILE_MODES) its compiled wrapper. A fresh wrapper per decode
    costs nothing: the wrappers share one compiled function (nets/compiled.compiled_forward) and its
    graphs."""
    if compile not in COMPILE_MODES:
        raise ValueError(f"compile must be one of {COMPILE_MODES}, got {compile!r}")
    return compiled(model, model.device.type, every_width=compile == "every_width") if compile else model


_sr_upsamplers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def pixel_upsampler(models: Models, r: int, mode: str) -> PixelUpsampler:
    """The pixel up-sampler of `mode` on the set's VQ; for 'sr', with the set's sr_x{r} network (loaded
    once per tokenizer and file), in the set's dtype; a network of another scale is resized to r and said
    so in a warning."""
    tokenizer = models.require("vq")
    if mode != SR_MODE:
        return PixelUpsampler(tokenizer, r, mode)
    path = models.model_set.path(SR_NETWORKS[r], SR_PURPOSE)
    cached = _sr_upsamplers.setdefault(tokenizer, {})
    if (path, r) not in cached:
        dtype = resolve_dtype(models.model_set.dtype)
        upsampler = PixelUpsampler(tokenizer, r, sr_model_path=path, dtype=dtype)
        if getattr(upsampler.sr_model, "resized_from", None):
            warnings.warn(f"pixel up-sampler: {upsampler.sr_model.describe()}", stacklevel=2)
        cached[(path, r)] = upsampler
    return cached[(path, r)]


def _downsampler(models: Models, r: int, kind: str, knobs: dict):
    """decode_mulo's down-sampler of `kind`; None for a mode that never calls one."""
    if not _uses_downsampler(knobs):
        return None
    if kind == "pixel":
        return PixelDownsampler(models.require("vq"), r)
    return models.require(f"downsampler_r{r}", DOWNSAMPLER)


def tensor_to_pil(image: torch.Tensor) -> Image.Image:
    """Image [3, H, W] in [-1, 1] -> RGB PIL image."""
    array = ((image.detach().float().cpu().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
    return Image.fromarray(array.permute(1, 2, 0).numpy())
