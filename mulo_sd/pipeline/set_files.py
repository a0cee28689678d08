"""Model-set files (conf/models/*.yaml) read into the config `ModelSet.from_config` takes, for
`MuLoPipeline.from_pretrained` (mulo_sd/pipeline/mulo_pipeline.py). The entry points compose them with Hydra;
the runtime imports neither Hydra nor OmegaConf, and the sets use two of their features only, read here the
way Hydra composes them (tests/pipeline/test_set_files.py compares every packaged set):
- a defaults list of other sets and `_self_` (last when left out), merged in order, mappings key by key; a
  set is looked up beside the file, then among the packaged ones;
- `${testbed:}` and `${testbed:<model>}`: the packaged testbed folder (training/config.py registers the
  resolver for Hydra). Any other interpolation is an error.

The packaged sets are read as data from the `mulo_sd.conf` package's folder, which is never imported.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import yaml

from mulo_sd.pipeline.roles import TESTBED_DIR

SUFFIXES = (".yaml", ".yml")
TESTBED_REFERENCE = re.compile(r"\$\{testbed:(\w*)\}")


def config_folder() -> Path | None:
    """The folder of the installed `mulo_sd.conf` package (found, never imported), or None without it."""
    spec = importlib.util.find_spec("mulo_sd.conf")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def packaged_sets() -> dict[str, Path]:
    """Set name -> file of every set shipped in conf/models/ (none when the configs are not installed)."""
    folder = config_folder()
    if folder is None:
        return {}
    return {path.stem: path for path in sorted((folder / "models").glob("*.yaml"))}


def set_config(name_or_path: str | Path) -> dict:
    """The config of a packaged set's name, a set file, or a folder in the testbed layout (the packaged
    `folder` set with that folder as its root)."""
    packaged = packaged_sets()
    if str(name_or_path) in packaged:
        return read_set_file(packaged[str(name_or_path)])
    path = Path(name_or_path)
    if path.is_file() and path.suffix in SUFFIXES:
        return read_set_file(path)
    if path.is_dir():
        if "folder" not in packaged:
            raise FileNotFoundError(f"{path}: reading a folder needs the packaged conf/models/folder.yaml")
        return {**read_set_file(packaged["folder"]), "root": str(path)}
    raise FileNotFoundError(
        f"no model set {str(name_or_path)!r}: give a set's name ({sorted(packaged)}), a set file "
        f"({'/'.join(SUFFIXES)}, e.g. conf/models/tar_1024.yaml) or a folder in the testbed layout"
    )


def read_set_file(path: Path) -> dict:
    """The set of the file `path` with its defaults list composed and `${testbed:...}` resolved."""
    return _resolved(_composed(Path(path), ()), "")


def _composed(path: Path, seen: tuple[Path, ...]) -> dict:
    if path.resolve() in seen:
        raise ValueError(f"{path}: its defaults list includes itself ({' -> '.join(map(str, seen))})")
    own = yaml.safe_load(path.read_text()) or {}
    defaults = own.pop("defaults", None) or []
    if "_self_" not in defaults:
        defaults = [*defaults, "_self_"]
    composed: dict = {}
    for entry in defaults:
        if not isinstance(entry, str):
            raise ValueError(f"{path}: defaults entry {entry!r}: only other sets' names and _self_ are read")
        part = own if entry == "_self_" else _composed(_default_file(path, entry), (*seen, path.resolve()))
        composed = _merged(composed, part)
    return composed


def _default_file(path: Path, name: str) -> Path:
    beside = path.parent / f"{name}.yaml"
    found = beside if beside.is_file() else packaged_sets().get(name)
    if found is None:
        raise FileNotFoundError(f"{path}: defaults entry '{name}': no {beside} and no packaged set '{name}'")
    return found


def _merged(base: dict, override: dict) -> dict:
    merged = dict(base)
    for key, value in override.items():
        both = isinstance(value, dict) and isinstance(merged.get(key), dict)
        merged[key] = _merged(merged[key], value) if both else value
    return merged


def _resolved(value, key: str):
    if isinstance(value, dict):
        return {name: _resolved(item, f"{key}.{name}".lstrip(".")) for name, item in value.items()}
    if not isinstance(value, str) or "${" not in value:
        return value
    match = TESTBED_REFERENCE.fullmatch(value)
    if match is None:
        only = "${testbed:} and ${testbed:<model>}"
        raise ValueError(f"{key}: {value!r}: a set file interpolates only {only}")
    folder = TESTBED_DIR / match.group(1) if match.group(1) else TESTBED_DIR
    if not folder.is_dir():
        raise FileNotFoundError(f"{key}: {value!r}: no packaged testbed model in {folder}")
    return str(folder)
