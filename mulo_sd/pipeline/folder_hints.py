"""What to put where: the commands that make a model set's folder for a role, by family, for the errors that
name a missing or mismatched folder (mulo_sd/pipeline/model_set.py, mulo_sd/pipeline/set_checks.py)."""

from __future__ import annotations

from pathlib import Path

from mulo_sd.llamagen.t5 import T5_FILES_HINT
from mulo_sd.pipeline.roles import (
    GPT_ROLES,
    MLLM,
    MODEL_CLASSES,
    SAMPLERS,
    SR_NETWORKS,
    TATOK,
    TESTBED_DIR,
    TEXT_ENCODER,
)
from mulo_sd.pipeline.set_files import config_folder
from mulo_sd.tar.files import TAR_FILES_HINT


def train_command(name: str, folder: str | Path = TESTBED_DIR) -> str:
    """The command that trains and exports testbed model `name` into `folder`/`name`."""
    return export_command(name, Path(folder) / name)


def export_command(name: str, path: str | Path) -> str:
    """The command that trains testbed model `name` and exports it into the folder `path`: the experiment
    named after the folder where there is one (e.g. upsampler_r4_256 for the 32x32 set), else `name`'s."""
    path = Path(path).resolve()
    experiment = path.name if _is_testbed_experiment(path.name) else name
    try:
        path = path.relative_to(Path.cwd())
    except ValueError:
        pass  # outside the working directory: keep it absolute
    return f"mulo-train experiment=testbed/{experiment} export={path}"


def _is_testbed_experiment(name: str) -> bool:
    """Whether the installed configs hold conf/experiment/testbed/<name>.yaml."""
    folder = config_folder()
    return folder is not None and (folder / "experiment" / "testbed" / f"{name}.yaml").is_file()


def tar_hint(role: str, path: Path) -> str:
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


def llamagen_hint(role: str, path: Path) -> str:
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


def folder_hint(family: str, role: str, folder: Path) -> str:
    """How the folder `folder` for `role` of a set of `family` is made."""
    if role == TEXT_ENCODER:
        return T5_FILES_HINT.format(folder=folder)
    if role in SR_NETWORKS.values() and family != "testbed":
        return (
            f"put a super-resolution state-dict file there (.safetensors or .pth of an architecture spandrel "
            f"knows, e.g. Real-ESRGAN's RealESRGAN_x{role[-1]}plus.pth) or a folder holding one "
            f"(docs/super_resolution.md)"
        )
    if family == "testbed":
        return f"train and export it with `{export_command(role, folder)}`"
    if family == "tar":
        return tar_hint(role, folder)
    return llamagen_hint(role, folder)


def missing_folder_message(set_name: str, family: str, role: str, folder: Path) -> str:
    """The error for a set whose folder `folder` for `role` is not there."""
    if family == "testbed" and role in MODEL_CLASSES:
        return (
            f"testbed model '{role}' not found in {folder}: train and export it with\n"
            f"    {export_command(role, folder)}"
        )
    return f"model set '{set_name}': {role} folder {folder} not found: {folder_hint(family, role, folder)}"
