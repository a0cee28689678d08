"""`--help` of `mulo-decode` and `mulo-eval` (training/commands.py), written from the Hydra config files
themselves: every setting with its default (the YAML value) and its comment as the description, the config
groups with their choices (each file's first sentence). Reads the files with PyYAML and plain text only, so
it answers in well under a second, without importing torch, Lightning or Hydra.

A setting's description is its inline comment and the comment lines right above it (a blank line ends a
comment block); a file's leading block is its header when it starts with `@package` or precedes `defaults:`.
"""

from __future__ import annotations

import re
import shutil
import textwrap
from dataclasses import dataclass
from pathlib import Path

import yaml

CONFIG_DIR = Path(__file__).resolve().parent.parent / "conf"  # mulo_sd.conf, installed or in the source tree
INLINE_COMMENT = re.compile(r"\s+#\s?(.*)$")
KEY = re.compile(r"^(\s*)([A-Za-z_][\w-]*):(.*)$")
SKIPPED = ("defaults",)  # the defaults list: the config groups, listed with their choices
NAME_COLUMN = 36  # a name=default wider than this puts its description on the next line


@dataclass
class Knob:
    name: str  # dotted, as an override takes it
    default: object  # the YAML value
    about: str  # the comment
    section: bool = False  # a mapping whose settings follow


@dataclass
class ConfigText:
    header: list[str]  # the file's leading comment block, without `@package`
    knobs: list[Knob]


def shown(value) -> str:
    """A YAML value as an override writes it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"' if not value or " " in value else value
    if isinstance(value, list):
        return "[" + ", ".join(shown(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{key}: {shown(item)}" for key, item in value.items()) + "}"
    return str(value)


def _lookup(data, dotted: str):
    for part in dotted.split("."):
        data = data.get(part) if isinstance(data, dict) else None
    return data


def _merged(base: dict, over: dict) -> dict:
    merged = dict(base)
    for key, value in over.items():
        both = isinstance(value, dict) and isinstance(merged.get(key), dict)
        merged[key] = _merged(merged[key], value) if both else value
    return merged


def model_set(name: str) -> dict:
    """conf/models/<name>.yaml over the sets its defaults list names (as Hydra merges them)."""
    data = yaml.safe_load((CONFIG_DIR / "models" / f"{name}.yaml").read_text()) or {}
    merged: dict = {}
    for entry in data.pop("defaults", []):
        merged = _merged(merged, data if entry == "_self_" else model_set(entry))
    return _merged(merged, data)


def default_shown(value, models: dict) -> str:
    """`shown(value)`; a `${models.<key>}` default also gives the default model set's value."""
    match = re.fullmatch(r"\$\{models\.([\w.]+)\}", value) if isinstance(value, str) else None
    if match is None:
        return shown(value)
    return f"{shown(_lookup(models, match.group(1)))} (models.{match.group(1)})"


def read_config(path: Path, prefix: str = "") -> ConfigText:
    """The header and the settings (in file order) of one config file; names get `prefix.` in front."""
    text = path.read_text()
    data = yaml.safe_load(text) or {}
    header: list[str] = []
    knobs: list[Knob] = []
    block: list[str] = []
    parents: list[tuple[int, str]] = []  # (indent, key) of the mappings around the current line
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("- "):
            block = []
            continue
        if stripped.startswith("#"):
            block.append(stripped.lstrip("#").strip())
            continue
        match = KEY.match(line)
        if match is None:
            continue
        indent, key, rest = len(match.group(1)), match.group(2), match.group(3)
        if not knobs and block and (block[0].startswith("@package") or key == "defaults") and not header:
            header, block = [entry for entry in block if not entry.startswith("@package")], []
        while parents and parents[-1][0] >= indent:
            parents.pop()
        inline = INLINE_COMMENT.search(rest)
        value_text = (rest[: inline.start()] if inline else rest).strip()
        dotted = ".".join([*(name for _, name in parents), key])
        if dotted.split(".")[0] not in SKIPPED:
            about = " ".join([*block, *([inline.group(1)] if inline else [])]).strip()
            name = f"{prefix}.{dotted}" if prefix else dotted
            knobs.append(Knob(name, _lookup(data, dotted), about, section=not value_text))
        if not value_text:
            parents.append((indent, key))
        block = []
    return ConfigText(header, knobs)


def first_sentence(lines: list[str], limit: int = 150) -> str:
    """The first sentence of a comment block (example command lines left out), at most `limit` characters,
    cut between words."""
    text = " ".join(line for line in lines if not line.startswith(("mulo-", "python ")))
    sentence = re.split(r"(?<=\.)\s+(?=[A-Z`(])", text, maxsplit=1)[0]
    if len(sentence) <= limit:
        return sentence
    return sentence[: sentence.rfind(" ", 0, limit - 3)] + "..."


def group_choices(group: str) -> list[tuple[str, str]]:
    """(choice, its first sentence) for every file of a config group."""
    choices = []
    for path in sorted((CONFIG_DIR / group).glob("*.yaml")):
        comment = []
        for line in path.read_text().splitlines():
            if not line.startswith("#"):
                break
            entry = line.lstrip("#").strip()
            if not entry.startswith("@package") and not line.startswith("#   "):
                comment.append(entry)
        choices.append((path.stem, first_sentence(comment)))
    return choices


def _wrapped(text: str, first: str, width: int, column: int = NAME_COLUMN) -> list[str]:
    """`first` (a name column `column` wide) followed by `text`, wrapped between words with a hanging
    indent; a longer `first` gets a line of its own."""
    indent = " " * (column + 4)
    if len(first) > column + 2:
        lines = [first.rstrip()]
        first = indent
    else:
        lines = []
        first = f"{first:<{column + 4}}"
    body = textwrap.wrap(text or "-", width, initial_indent=first, subsequent_indent=indent,
                         break_long_words=False, break_on_hyphens=False)  # fmt: skip
    return lines + body


def render_knobs(knobs: list[Knob], width: int, models: dict) -> list[str]:
    lines = []
    for knob in knobs:
        if knob.section:
            if knob.about:
                lines += [""] + textwrap.wrap(f"{knob.name}.*: {knob.about}", width, initial_indent="  ",
                                              subsequent_indent="    ", break_long_words=False,
                                              break_on_hyphens=False)  # fmt: skip
            continue
        lines += _wrapped(knob.about, f"  {knob.name}={default_shown(knob.default, models)}", width)
    return lines


def command_help(
    command: str, about: str, entry: str, groups: tuple[str, ...], setting_groups=(), note: str = ""
) -> str:
    """The whole `--help` text of `command` (`about`: what it does) from its entry config
    (conf/<entry>.yaml): the examples of its headers, the choices of the config groups `groups`, the
    settings of the entry config and of the chosen files of `setting_groups` (`note`: what else sets
    them), then the run folder's."""
    width = min(shutil.get_terminal_size((110, 24)).columns, 110) - 1
    entry_file = CONFIG_DIR / f"{entry}.yaml"
    defaults = yaml.safe_load(entry_file.read_text())["defaults"]
    chosen = {key: value for item in defaults if isinstance(item, dict) for key, value in item.items()}
    parts = [read_config(entry_file)]
    parts += [read_config(CONFIG_DIR / group / f"{chosen[group]}.yaml") for group in setting_groups]
    paths = read_config(CONFIG_DIR / "paths" / f"{chosen['paths']}.yaml", "paths").knobs
    models = model_set(chosen["models"])
    examples = [line for part in parts for line in part.header if line.startswith(command)]
    lines = [f"{command}: {about}", ""]
    lines += [f"usage: {command} [KEY=VALUE ...]  (Hydra overrides; --hydra-help: Hydra's own options)"]
    lines += ["", "examples:", *(f"  {line}" for line in examples)]
    for group in groups:
        choices = group_choices(group)
        column = max(len(name) for name, _ in choices) + 2
        lines += ["", f"{group}=NAME (default {chosen[group]}):"]
        lines += [text for name, gist in choices for text in _wrapped(gist, f"  {name}", width, column)]
    knobs = [knob for part in parts for knob in part.knobs]
    lines += ["", f"settings (KEY=default, then what it does; {note}):", *render_knobs(knobs, width, models)]
    lines += ["", "where runs write:", *render_knobs(paths, width, models)]
    return "\n".join(lines) + "\n"
