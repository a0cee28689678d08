"""Model sets: one folder per role (tokenizer, target, drafters, samplers, text encoder), loaded and checked
together. The entry points take a set from the Hydra group `models` (conf/models/*.yaml):

    model_set = ModelSet.from_config({"name": "llamagen_t2i_xl_512", "family": "llamagen", "root": "/ckpts",
                                      "folders": {"vq": "vq_ds16_t2i", "target": "t2i_XL_stage2_512", ...}})
    models = load_model_set(model_set, names=["vq", "target", "drafter_r2"])  # -> Models
    cond, mask = models.condition(["a photo of a cat"])                       # word ids or T5 features

Roles (`ROLES`): `vq`, `target`, the drafters `drafter_r2` / `drafter_r4` (the target's grid over r) and
`drafter_small` (LANTERN's same-resolution drafter), `eagle_head` (EAGLE-2's draft head for the target:
mulo_sd/nets/eagle_head.py), the samplers `upsampler_r{2,4}` / `downsampler_r{2,4}`,
`sceneeval` (the testbed's evaluator), `text_encoder` (a FLAN-T5 folder for targets conditioned on T5
caption features: mulo_sd/llamagen/t5.py), and Tar's first stage: `mllm` (a Qwen2-family folder) with `tatok`
(the
TA-Tok checkpoint file), which turn a prompt into the TA-Tok features its AR-DTok GPTs are conditioned on
(mulo_sd/tar/files.py, mulo_sd/pipeline/tar_decode.py). A set names a folder for any subset; relative folders
sit
under `root`.

Everything that can disagree is checked from the folders' config files before any weights load, with an
error naming the role, the file and the field: codebook size and code dimension of every GPT and sampler
against the VQ, each drafter's grid against the target's grid over its r, the samplers' r, one condition
kind and one caption prefix for all GPTs, the T5 folder's presence and feature width; for Tar, a Qwen2-family
MLLM folder and TA-Tok features as wide as the AR-DTok's clip projection. A sampler's stored codebook
vectors are compared with the VQ's once loaded. `dtype` applies to the AR models, the T5 encoder and the MLLM
(LlamaGen's sample_t2i.py and Tar's t2i_inference.py run those in bf16, the VQ in float32); VQ and samplers
stay float32.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from mulo_sd.llamagen.t5 import T5_FILES_HINT, T5TextEncoder, t5_feature_width
from mulo_sd.nets.downsampler import Downsampler
from mulo_sd.nets.dtypes import resolve_dtype
from mulo_sd.nets.eagle_head import EagleHead
from mulo_sd.nets.gpt import GPT
from mulo_sd.nets.io import CONFIG_NAME
from mulo_sd.nets.upsampler import Upsampler
from mulo_sd.nets.vq import VQModel
from mulo_sd.tar.files import TAR_FILES_HINT, check_mllm_folder, read_tatok_shape
from mulo_sd.testbed.captions import encode_caption
from mulo_sd.testbed.sceneeval import SceneEval

if TYPE_CHECKING:  # transformers' Qwen2 is imported only for sets that have an MLLM
    from mulo_sd.tar.mllm import TarMLLM

TESTBED_DIR = Path(__file__).resolve().parents[1] / "assets" / "testbed"

# role -> model class of the folder; the drafters and samplers are kept by these names in `Models`
MODEL_CLASSES = {
    "vq": VQModel,
    "target": GPT,
    "drafter_r2": GPT,
    "drafter_r4": GPT,
    "drafter_small": GPT,
    "eagle_head": EagleHead,
    "upsampler_r2": Upsampler,
    "upsampler_r4": Upsampler,
    "downsampler_r2": Downsampler,
    "downsampler_r4": Downsampler,
    "sceneeval": SceneEval,
}
TEXT_ENCODER = "text_encoder"
MLLM, TATOK = "mllm", "tatok"  # Tar's first stage: a folder and a file
ROLES = (*MODEL_CLASSES, TEXT_ENCODER, MLLM, TATOK)
DRAFTERS = ("drafter_r2", "drafter_r4", "drafter_small")
SAMPLERS = ("upsampler_r2", "upsampler_r4", "downsampler_r2", "downsampler_r4")
GPT_ROLES = ("target", *DRAFTERS)
SCALES = {"drafter_r2": 2, "drafter_r4": 4, "drafter_small": 1, **{name: int(name[-1]) for name in SAMPLERS}}
FAMILIES = ("testbed", "llamagen", "tar")
# sampler: the image-token GPTs' sampling defaults; mllm_sampler: Tar's first stage's; knobs: the set's
# method knobs over mulo_sd.pipeline.decode_entry.RECOMMENDED (e.g. MuLo-SD's r where the set has only one
# drafter)
CONFIG_KEYS = ("name", "family", "root", "folders", "device", "dtype", "sampler", "mllm_sampler", "knobs")


def train_command(name: str, folder: str | Path = TESTBED_DIR) -> str:
    """The command that trains and exports testbed model `name` into `folder`/`name`."""
    return export_command(name, Path(folder) / name)


def export_command(name: str, path: str | Path) -> str:
    """The command that trains testbed model `name` and exports it into the folder `path`."""
    path = Path(path).resolve()
    try:
        path = path.relative_to(Path.cwd())
    except ValueError:
        pass  # outside the working directory: keep it absolute
    return f"mulo-train experiment=testbed/{name} export={path}"


def _tar_hint(role: str, path: Path) -> str:
    """How a Tar set's folder or file for `role` is made (docs/tar.md)."""
    if role == "vq":
        return f"convert LlamaGen's tokenizer (Tar's VQ): mulo-convert llamagen-vq vq_ds16_t2i.pt {path}"
    if role in GPT_ROLES:
        return f"convert a Tar AR-DTok file: mulo-convert tar-ar-dtok <ar_dtok_lp_*px.pth> {path}"
    if role in SAMPLERS:
        return f"train it: mulo-train experiment=tar/{role} tar.root=<models.root> export={path}"
    if role in (MLLM, TATOK):
        return TAR_FILES_HINT[role].format(path=path)
    return "this family has no such model"


def _llamagen_hint(role: str, path: Path) -> str:
    """How a LlamaGen set's folder for `role` is made (docs/llamagen.md)."""
    if role == "vq":
        return f"convert LlamaGen's tokenizer: mulo-convert llamagen-vq vq_ds16_t2i.pt {path}"
    if role in GPT_ROLES:
        return (
            f"convert a LlamaGen t2i checkpoint: mulo-convert llamagen-gpt <t2i_XL_stage*.pt> {path} "
            f"--image-size <its resolution>"
        )
    if role in SAMPLERS:
        return f"train it: mulo-train experiment=llamagen/{role} llamagen.root=<models.root> export={path}"
    return "this family has no such model"


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
                f"models.root>; {self.hint(role, Path('<folder>'))}"
            )
        if role == TATOK:
            present = folder.is_file()
        elif role in (TEXT_ENCODER, MLLM):
            present = folder.is_dir()
        else:
            present = (folder / CONFIG_NAME).is_file()
        if not present:
            raise FileNotFoundError(self.missing_message(role))
        return folder

    def missing_message(self, role: str) -> str:
        folder = self.folders[role]
        if self.family == "testbed" and role in MODEL_CLASSES:
            return (
                f"testbed model '{role}' not found in {folder}: train and export it with\n"
                f"    {export_command(role, folder)}"
            )
        return f"model set '{self.name}': {role} folder {folder} not found: {self.hint(role, folder)}"

    def hint(self, role: str, folder: Path) -> str:
        if role == TEXT_ENCODER:
            return T5_FILES_HINT.format(folder=folder)
        if self.family == "testbed":
            return f"train and export it with `{export_command(role, folder)}`"
        if self.family == "tar":
            return _tar_hint(role, folder)
        return _llamagen_hint(role, folder)

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
    model_set: ModelSet, names: list[str] | None = None, device: str | torch.device | None = None
) -> Models:
    """Load the roles `names` of `model_set` (None: every model role that exists; the text encoder comes
    with any T5-conditioned GPT) onto `device` (None: the set's). Checks the configs before reading any
    weights (module docstring); a role the set lacks is a FileNotFoundError saying how to make it. GPTs
    conditioned on TA-Tok features bring the MLLM (and its TA-Tok file) with them."""
    device = model_set.device if device is None else device
    if torch.device(device).type == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            f"model set '{model_set.name}' loads on {device}, but this machine has no CUDA device: set "
            f"models.device=cpu (and models.dtype=float32: bfloat16 is slow on CPUs)"
        )
    names = model_set.available() if names is None else list(dict.fromkeys(names))
    unknown = sorted(set(names) - set(ROLES))
    if unknown:
        raise ValueError(f"unknown model role(s) {unknown}; known: {list(ROLES)}")
    configs = {name: model_set.config(name) for name in names if name in MODEL_CLASSES}
    if model_set.family == "tar":
        check_ar_dtoks(model_set, configs)
    t5 = [name for name, config in configs.items() if name in GPT_ROLES and config.cond_type == "t5"]
    if t5 and TEXT_ENCODER not in names:
        names.append(TEXT_ENCODER)
    tatok = [name for name, config in configs.items() if name in GPT_ROLES and config.cond_type == "tatok"]
    if (tatok or TATOK in names) and MLLM not in names:
        names.append(MLLM)
    check_configs(model_set, configs, t5_width(model_set) if TEXT_ENCODER in names else None)
    scale = check_tar_stage(model_set, configs) if MLLM in names else 0
    dtype = resolve_dtype(model_set.dtype)
    models = Models(folder=model_set.root or TESTBED_DIR, model_set=model_set)
    for name in configs:
        model = MODEL_CLASSES[name].from_pretrained(model_set.folders[name], device)
        if name in (*GPT_ROLES, "eagle_head"):
            model = model.to(dtype)
        if name == "vq":
            models.tokenizer = model
        elif name in ("target", "sceneeval"):
            setattr(models, name, model)
        elif name in (*DRAFTERS, "eagle_head"):
            models.drafters[name] = model
        else:
            models.samplers[name] = model
    if TEXT_ENCODER in names:
        lengths = {configs[name].cond_len for name in t5} or {None}
        kwargs = {} if None in lengths else {"max_length": lengths.pop()}
        models.text_encoder = T5TextEncoder(model_set.folders[TEXT_ENCODER], device, dtype, **kwargs)
    if MLLM in names:
        from mulo_sd.tar.mllm import TarMLLM  # transformers' Qwen2: only for sets that have one

        models.mllm = TarMLLM.from_pretrained(
            model_set.folders[MLLM],
            model_set.folders[TATOK],
            device=str(device),
            dtype=model_set.dtype,
            scale=scale,
        )
    if models.tokenizer is not None:
        for name, sampler in models.samplers.items():
            try:
                sampler.check_tokenizer(models.tokenizer)
            except ValueError as error:
                raise ValueError(
                    f"model set '{model_set.name}': {name} ({model_set.folders[name]}): {error}"
                ) from None
    return models


def t5_width(model_set: ModelSet) -> int:
    """d_model of the set's T5 folder, from its config.json; errors name what to put where."""
    return t5_feature_width(model_set.path(TEXT_ENCODER, "the T5 encoder of the set's captions"))


def check_ar_dtoks(model_set: ModelSet, configs: dict) -> None:
    """Raise unless every GPT of a Tar set is an AR-DTok (conditioned on TA-Tok features)."""
    for role, config in configs.items():
        if role in GPT_ROLES and config.cond_type != "tatok":
            raise ValueError(
                f"model set '{model_set.name}': {role} ({model_set.folders[role] / CONFIG_NAME}) has "
                f"cond_type '{config.cond_type}', but a Tar set's GPTs are AR-DTok models conditioned on "
                f"TA-Tok features (cond_type 'tatok'): {_tar_hint(role, Path('<folder>'))}"
            )


def check_tar_stage(model_set: ModelSet, configs: dict) -> int:
    """Raise unless the set's MLLM folder is a Qwen2-family LM and its TA-Tok file gives features as wide
    as every AR-DTok's clip projection takes, at a scale with as many codes as their prefix (all read
    without loading weights). Returns that scale: the one the MLLM writes."""
    prefix = f"model set '{model_set.name}': "
    check_mllm_folder(model_set.path(MLLM, "Tar's MLLM, which writes the TA-Tok tokens of a prompt"))
    tatok = model_set.path(TATOK, "the TA-Tok codebook of the MLLM's tokens")
    shape = read_tatok_shape(tatok)
    scale = 0
    for role, config in configs.items():
        if role not in GPT_ROLES:
            continue
        where = f"{prefix}{role} ({model_set.folders[role] / CONFIG_NAME})"
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
    """Raise unless the roles' configs fit together (module docstring)."""

    def where(role: str) -> str:
        return f"{role} ({model_set.folders[role] / CONFIG_NAME})"

    prefix = f"model set '{model_set.name}': "
    vq = configs.get("vq")
    if vq is not None:
        size, dim = vq.codebook_size, vq.codebook_embed_dim
        for role, config in configs.items():
            if role in GPT_ROLES and config.vocab_size != size:
                raise ValueError(
                    f"{prefix}{where(role)} predicts vocab_size {config.vocab_size} token ids, but the vq "
                    f"({model_set.folders['vq']}) has codebook_size {size}: both must come from one tokenizer"
                )
            if role in SAMPLERS and (config.codebook_size, config.code_dim) != (size, dim):
                raise ValueError(
                    f"{prefix}{where(role)} was trained for codebook_size {config.codebook_size} and "
                    f"code_dim {config.code_dim}, but the vq has codebook_size {size} and codebook_embed_dim "
                    f"{dim}"
                )
    gpts = {role: config for role, config in configs.items() if role in GPT_ROLES}
    if "target" in gpts and "eagle_head" in configs:
        head, target = configs["eagle_head"], gpts["target"]
        trained = {f: getattr(head, f) for f in ("vocab_size", "grid_size", "dim")}
        actual = {f: getattr(target, f) for f in trained}
        if trained != actual:
            raise ValueError(
                f"{prefix}{where('eagle_head')} was trained for a target with {trained}; the target has "
                f"{actual}"
            )
    if "target" in gpts:
        target = gpts["target"]
        height, width = target.grid_size
        for role, config in gpts.items():
            r = SCALES.get(role)
            if r is None:
                continue
            wanted = (height // r, width // r)
            if height % r or width % r or tuple(config.grid_size) != wanted:
                what = "the target's grid" if r == 1 else f"the target's {height}x{width} grid over r={r}"
                raise ValueError(
                    f"{prefix}{where(role)} has grid_size {list(config.grid_size)}, but {what} is "
                    f"{list(wanted)}: a {role} decodes {'the same' if r == 1 else f'1/{r}'} of the target's "
                    f"resolution"
                )
            if config.vocab_size != target.vocab_size:
                raise ValueError(
                    f"{prefix}{where(role)} has vocab_size {config.vocab_size}, the target "
                    f"{target.vocab_size}"
                )
        for role in SAMPLERS:
            if role in configs and configs[role].codebook_size != target.vocab_size:
                raise ValueError(
                    f"{prefix}{where(role)} has codebook_size {configs[role].codebook_size}, but the target "
                    f"predicts {target.vocab_size} token ids"
                )
    for role in SAMPLERS:
        if role in configs and configs[role].r != SCALES[role]:
            raise ValueError(
                f"{prefix}{where(role)} has r={configs[role].r}; role {role} needs r={SCALES[role]}"
            )
    check_conditions(prefix, gpts, where, t5_dim)


def check_conditions(prefix: str, gpts: dict, where, t5_dim: int | None) -> None:
    """One condition kind and prefix for every GPT (they decode one caption together); T5 width."""
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
    if t5_dim is None:
        return
    for role, config in gpts.items():
        if config.cond_type == "t5" and config.caption_dim != t5_dim:
            raise ValueError(
                f"{prefix}{where(role)} takes caption_dim {config.caption_dim}, but the text_encoder gives "
                f"{t5_dim}-d T5 features (d_model): use the T5 the GPT was trained with (LlamaGen's: "
                f"flan-t5-xl)"
            )
