"""Model sets: one folder per role (tokenizer, target, drafters, samplers, text encoder), loaded and checked
together. The entry points take a set from the Hydra group `models` (conf/models/*.yaml):

    model_set = ModelSet.from_config({"name": "llamagen_t2i_xl_512", "family": "llamagen", "root": "/ckpts",
                                      "folders": {"vq": "vq_ds16_t2i", "target": "t2i_XL_stage2_512", ...}})
    models = load_model_set(model_set, names=["vq", "target", "drafter_r2"])  # -> Models
    cond, mask = models.condition(["a photo of a cat"])                       # word ids or T5 features

Roles (`ROLES`, mulo_sd/pipeline/roles.py): `vq`, `target`, the drafters `drafter_r2` / `drafter_r4` (the
target's grid over r) and `drafter_small` (LANTERN's same-resolution drafter), `eagle_head` (EAGLE-2's draft
head for the target: mulo_sd/nets/eagle_head.py), the samplers `upsampler_r{2,4}` / `downsampler_r{2,4}`,
`sceneeval` (the testbed's evaluator), `text_encoder` (a FLAN-T5 folder for targets conditioned on T5
caption features: mulo_sd/llamagen/t5.py), and Tar's first stage: `mllm` (a Qwen2-family folder) with `tatok`
(the TA-Tok checkpoint file), which turn a prompt into the TA-Tok features its AR-DTok GPTs are conditioned
on (mulo_sd/tar/files.py, mulo_sd/pipeline/tar_decode.py), and `sr_x2` / `sr_x4`: the super-resolution
network the pixel up-sampler enlarges with under knobs.pixel_mode=sr (a state-dict file spandrel reads, or
a folder holding one: mulo_sd/nets/sr_network.py, docs/super_resolution.md). A set names a folder for any
subset; relative folders sit under `root`; a missing one is an error saying how to make it
(mulo_sd/pipeline/folder_hints.py).

Everything that can disagree is checked from the folders' config files before any weights load
(mulo_sd/pipeline/set_checks.py), with an error naming the role, the file and the field: codebook size and
code dimension of every GPT and sampler against the VQ, each drafter's grid against the target's grid over
its r, the samplers' r, one condition kind and one caption prefix for all GPTs, the T5 folder's presence and
feature width; for Tar, a Qwen2-family MLLM folder and TA-Tok features as wide as the AR-DTok's clip
projection. A sampler's stored codebook vectors are compared with the VQ's once loaded. `dtype` applies to
the AR models, the T5 encoder and the MLLM (LlamaGen's sample_t2i.py and Tar's t2i_inference.py run those in
bf16, the VQ in float32); VQ and samplers stay float32.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from mulo_sd.llamagen.t5 import T5TextEncoder
from mulo_sd.nets.dtypes import resolve_dtype
from mulo_sd.nets.eagle_head import EagleHead
from mulo_sd.nets.gpt import GPT
from mulo_sd.nets.io import CONFIG_NAME
from mulo_sd.nets.vq import VQModel
from mulo_sd.pipeline.folder_hints import folder_hint, missing_folder_message
from mulo_sd.pipeline.roles import (
    DRAFTERS,
    FAMILIES,
    GPT_ROLES,
    MLLM,
    MODEL_CLASSES,
    ROLES,
    SR_NETWORKS,
    TATOK,
    TESTBED_DIR,
    TEXT_ENCODER,
)
from mulo_sd.pipeline.set_checks import (
    check_ar_dtoks,
    check_configs,
    check_sampler_codebooks,
    check_tar_stage,
    t5_width,
)
from mulo_sd.testbed.captions import encode_caption
from mulo_sd.testbed.sceneeval import SceneEval

if TYPE_CHECKING:  # transformers' Qwen2 is imported only for sets that have an MLLM
    from mulo_sd.tar.mllm import TarMLLM

# sampler: the image-token GPTs' sampling defaults; mllm_sampler: Tar's first stage's; knobs: the set's
# method knobs over mulo_sd.pipeline.decode_entry.RECOMMENDED (e.g. MuLo-SD's r where the set has only one
# drafter)
CONFIG_KEYS = ("name", "family", "root", "folders", "device", "dtype", "sampler", "mllm_sampler", "knobs")


@dataclass
class ModelSet:
    """Where each role's folder is (None: the set has none), and how to load them."""

    name: str
    folders: dict[str, Path | None]
    root: Path | None = None  # the folder relative folders were joined to
    family: str = "testbed"
    device: str = "cpu"
    dtype: str = "float32"

    def __post_init__(self):
        if self.family not in FAMILIES:
            raise ValueError(
                f"model set '{self.name}': family must be one of {FAMILIES}, not {self.family!r}"
            )
        unknown = sorted(set(self.folders) - set(ROLES))
        if unknown:
            raise ValueError(f"model set '{self.name}': unknown role(s) {unknown} in folders; known: {ROLES}")
        self.folders = {role: self.folders.get(role) for role in ROLES}
        resolve_dtype(self.dtype)  # a bad name fails here

    @classmethod
    def from_config(cls, cfg: Mapping) -> ModelSet:
        """A set from a `models` config (conf/models/*.yaml): name, family, root, folders, device, dtype (and
        sampler, read by the entry points); relative folders are joined to `root`."""
        unknown = sorted(set(cfg) - set(CONFIG_KEYS))
        if unknown:
            raise ValueError(f"unknown key(s) {unknown} in the models config; it takes {CONFIG_KEYS}")
        name = cfg.get("name") or "models"
        root = cfg.get("root")
        if root in (None, "", "???"):
            raise ValueError(
                f"model set '{name}': models.root is not set: give the folder that holds its model folders, "
                f"e.g. models.root=/ckpts"
            )
        folders = {
            role: None if folder is None else Path(root) / str(folder)
            for role, folder in (cfg.get("folders") or {}).items()
        }
        settings = {key: cfg[key] for key in ("family", "device", "dtype") if cfg.get(key) is not None}
        return cls(name=name, folders=folders, root=Path(root), **settings)

    @classmethod
    def layout(cls, root: str | Path, name: str = "testbed") -> ModelSet:
        """A folder in the testbed layout: every role in the subfolder of its name."""
        return cls(name=name, folders={role: Path(root) / role for role in ROLES}, root=Path(root))

    def path(self, role: str, purpose: str = "") -> Path:
        """The folder of `role`; a clear error when the set names none or it is missing."""
        if role not in ROLES:
            raise ValueError(f"unknown role '{role}'; known: {ROLES}")
        folder = self.folders[role]
        if folder is None:
            why = f" ({purpose})" if purpose else ""
            raise FileNotFoundError(
                f"model set '{self.name}' has no {role} folder{why}: set models.folders.{role}=<folder under "
                f"models.root>; {folder_hint(self.family, role, Path('<folder>'))}"
            )
        if role == TATOK:
            present = folder.is_file()
        elif role in SR_NETWORKS.values():  # a weight file or its folder (mulo_sd/nets/sr_network.py)
            present = folder.exists()
        elif role in (TEXT_ENCODER, MLLM):
            present = folder.is_dir()
        else:
            present = (folder / CONFIG_NAME).is_file()
        if not present:
            raise FileNotFoundError(missing_folder_message(self.name, self.family, role, folder))
        return folder

    def available(self) -> list[str]:
        """The model roles (not the text encoder) whose folder holds a config."""
        folders = self.folders
        return [r for r in MODEL_CLASSES if folders[r] is not None and (folders[r] / CONFIG_NAME).is_file()]

    def config(self, role: str):
        """The config of `role`'s model, from its config.json (no weights read)."""
        return MODEL_CLASSES[role].load_config(self.path(role))

    def target_cond_type(self) -> str:
        """The target's condition kind ('words', 't5', ...), from its config."""
        return self.config("target").cond_type


@dataclass
class Models:
    """The loaded models of a set; any of them may be absent (None / not in the dicts)."""

    folder: Path = TESTBED_DIR
    tokenizer: VQModel | None = None
    target: GPT | None = None
    drafters: dict[str, GPT | EagleHead] = field(default_factory=dict)  # by role: drafter_r2, eagle_head, ...
    samplers: dict[str, torch.nn.Module] = field(default_factory=dict)  # upsampler_r2, downsampler_r4, ...
    sceneeval: SceneEval | None = None
    text_encoder: T5TextEncoder | None = None
    mllm: TarMLLM | None = None  # Tar's first stage, with the TA-Tok file
    model_set: ModelSet | None = None

    def __post_init__(self):
        if self.model_set is None:
            self.model_set = ModelSet.layout(self.folder)

    def get(self, name: str):
        """The model loaded for role `name`, or None."""
        if name not in ROLES:
            raise ValueError(f"unknown model role '{name}'; known: {list(ROLES)}")
        if name == "vq":
            return self.tokenizer
        if name in ("target", "sceneeval", TEXT_ENCODER, MLLM):
            return getattr(self, name)
        if name == TATOK:  # read into the MLLM
            return self.mllm
        return {**self.drafters, **self.samplers}.get(name)

    def put(self, name: str, model) -> None:
        """Keep `model` (loaded from a folder of MODEL_CLASSES) as the model of role `name`."""
        if name == "vq":
            self.tokenizer = model
        elif name in ("target", "sceneeval"):
            setattr(self, name, model)
        elif name in (*DRAFTERS, "eagle_head"):
            self.drafters[name] = model
        else:
            self.samplers[name] = model

    def require(self, name: str, purpose: str = ""):
        """The model loaded for role `name`; if absent, an error saying how to get it."""
        model = self.get(name)
        if model is None:
            self.model_set.path(name, purpose)  # raises when the set lacks it
            raise FileNotFoundError(f"model '{name}' of set '{self.model_set.name}' was not loaded")
        return model

    def condition(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(cond, cond_mask) of caption texts for the target: word ids [B, cond_len] and None ('words'), or
        T5 features [B, cond_len, D] and their mask ('t5', the set's text encoder), on the target's device."""
        if not prompts or not all(isinstance(p, str) for p in prompts):
            raise ValueError(f"prompts must be a non-empty list of caption strings, got {prompts!r}")
        target = self.require("target")
        kind = target.config.cond_type
        if kind == "words":
            cond = torch.stack([encode_caption(p, target.config.cond_len) for p in prompts])
            return cond.to(target.device), None
        if kind == "t5":
            features, mask = self.require(TEXT_ENCODER, "the target takes T5 caption features")(prompts)
            return features.to(target.device), mask.to(target.device)
        if kind == "tatok":
            raise ValueError(
                "the target takes TA-Tok features, which Tar's MLLM writes for a prompt: decode through "
                "mulo_sd.pipeline.tar_decode.decode_tar (what mulo-decode does for a Tar set)"
            )
        raise ValueError(f"decoding takes caption text: the target needs cond_type words or t5, not '{kind}'")


def load_model_set(
    model_set: ModelSet,
    names: list[str] | None = None,
    device: str | torch.device | None = None,
    condition_roles: bool = True,
) -> Models:
    """Load the roles `names` of `model_set` (None: every model role that exists; the text encoder comes
    with any T5-conditioned GPT) onto `device` (None: the set's). Checks the configs before reading any
    weights (module docstring); a role the set lacks is a FileNotFoundError saying how to make it. GPTs
    conditioned on TA-Tok features bring the MLLM (and its TA-Tok file) with them. `condition_roles=False`
    loads `names` alone, for a caller that brings the condition itself (e.g. Tar's TA-Tok features:
    mulo_sd/pipeline/mulo_pipeline.py)."""
    device = model_set.device if device is None else device
    _check_device(model_set, device)
    names = model_set.available() if names is None else list(dict.fromkeys(names))
    unknown = sorted(set(names) - set(ROLES))
    if unknown:
        raise ValueError(f"unknown model role(s) {unknown}; known: {list(ROLES)}")
    configs = {name: model_set.config(name) for name in names if name in MODEL_CLASSES}
    if model_set.family == "tar":
        check_ar_dtoks(model_set, configs)
    names = _with_condition_roles(configs, names) if condition_roles else names
    check_configs(model_set, configs, t5_width(model_set) if TEXT_ENCODER in names else None)
    scale = check_tar_stage(model_set, configs) if MLLM in names else 0
    dtype = resolve_dtype(model_set.dtype)
    models = Models(folder=model_set.root or TESTBED_DIR, model_set=model_set)
    for name in configs:
        model = MODEL_CLASSES[name].from_pretrained(model_set.folders[name], device)
        models.put(name, model.to(dtype) if name in (*GPT_ROLES, "eagle_head") else model)
    if TEXT_ENCODER in names:
        models.text_encoder = _load_text_encoder(model_set, configs, device, dtype)
    if MLLM in names:
        models.mllm = _load_mllm(model_set, device, scale)
    if models.tokenizer is not None:
        check_sampler_codebooks(model_set, models.tokenizer, models.samplers)
    return models


def _check_device(model_set: ModelSet, device: str | torch.device) -> None:
    if torch.device(device).type == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            f"model set '{model_set.name}' loads on {device}, but this machine has no CUDA device: set "
            f"models.device=cpu (and models.dtype=float32: bfloat16 is slow on CPUs)"
        )


def _with_condition_roles(configs: dict, names: list[str]) -> list[str]:
    """`names` and the roles the GPTs' conditions come from: the text encoder for T5 features, the MLLM for
    TA-Tok features (and for the TA-Tok file, which is read into it)."""
    kinds = {config.cond_type for name, config in configs.items() if name in GPT_ROLES}
    names = list(names)
    if "t5" in kinds and TEXT_ENCODER not in names:
        names.append(TEXT_ENCODER)
    if ("tatok" in kinds or TATOK in names) and MLLM not in names:
        names.append(MLLM)
    return names


def _load_text_encoder(model_set: ModelSet, configs: dict, device, dtype: torch.dtype) -> T5TextEncoder:
    """The set's T5 encoder, its captions as long as the T5-conditioned GPTs' prefix (check_configs made
    it one length); without such a GPT, T5's own default length."""
    t5 = [name for name, config in configs.items() if name in GPT_ROLES and config.cond_type == "t5"]
    lengths = {configs[name].cond_len for name in t5} or {None}
    kwargs = {} if None in lengths else {"max_length": lengths.pop()}
    return T5TextEncoder(model_set.folders[TEXT_ENCODER], device, dtype, **kwargs)


def _load_mllm(model_set: ModelSet, device, scale: int) -> TarMLLM:
    """Tar's MLLM with the set's TA-Tok file, writing the tokens of TA-Tok scale `scale`."""
    from mulo_sd.tar.mllm import TarMLLM  # transformers' Qwen2: only for sets that have one

    return TarMLLM.from_pretrained(
        model_set.folders[MLLM],
        model_set.folders[TATOK],
        device=str(device),
        dtype=model_set.dtype,
        scale=scale,
    )
