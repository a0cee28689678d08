"""Reading a model's config dataclass from JSON (a folder's `config.json`, or the copy stored in its weights)
with errors that name the file and the field: invalid JSON (line and column), a wrong `kind`, unknown fields,
missing required fields, values of the wrong type, and the config's own checks.

JSON types per annotation: int (not a bool), float (an int or a float), str, bool, `X | None` (null or X),
`list[X]` and `tuple[X, Y]` (a JSON list; a tuple of that length).
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from pathlib import Path


class ModelFileError(ValueError):
    """A model folder's config.json or weights file is unreadable, or the two do not describe one model."""


def read_json(path: Path) -> dict:
    """The JSON object in `path`; ModelFileError on invalid JSON (line and column) or a non-object."""
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ModelFileError(
            f"{path}: invalid JSON at line {error.lineno}, column {error.colno}: {error.msg}"
        ) from None
    except UnicodeDecodeError as error:
        raise ModelFileError(f"{path}: not a UTF-8 text file ({error})") from None
    if not isinstance(raw, dict):
        raise ModelFileError(f"{path}: expected a JSON object of config fields, got {type(raw).__name__}")
    return raw


def config_from_dict(config_class: type, kind: str, raw: dict, source: str):
    """Build `config_class` from `raw` (a `kind` tag plus the fields), checked field by field; `source`
    names where `raw` came from in the errors."""
    raw = dict(raw)
    found = raw.pop("kind", None)
    if found != kind:
        raise ModelFileError(f"{source}: field 'kind' says it holds a {found!r} model, not a {kind!r} model")
    fields = {f.name: f for f in dataclasses.fields(config_class)}
    name = config_class.__name__
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise ModelFileError(f"{source}: unknown {name} field(s) {unknown}; known: {sorted(fields)}")
    missing = sorted(n for n, f in fields.items() if n not in raw and _required(f))
    if missing:
        raise ModelFileError(f"{source}: missing required {name} field(s) {missing}")
    hints = typing.get_type_hints(config_class)
    for field, value in raw.items():
        if not _matches(value, hints[field]):
            raise ModelFileError(
                f"{source}: field '{field}' must be {_describe(hints[field])}, got {json.dumps(value)}"
            )
    try:
        return config_class(**raw)
    except (ValueError, TypeError) as error:  # the config's own checks (__post_init__)
        raise ModelFileError(f"{source}: {error}") from None


def config_dict(config, kind: str) -> dict:
    """The JSON form of a config: the `kind` tag, then the fields."""
    return {"kind": kind, **dataclasses.asdict(config)}


def _required(field: dataclasses.Field) -> bool:
    return field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING


def _matches(value, annotation) -> bool:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, arg) for arg in args)
    if annotation is type(None):
        return value is None
    if annotation is bool:
        return isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if annotation is str:
        return isinstance(value, str)
    if origin is list:
        return isinstance(value, list) and all(_matches(v, args[0]) for v in value)
    if origin is tuple:
        return (
            isinstance(value, list)
            and len(value) == len(args)
            and all(_matches(v, arg) for v, arg in zip(value, args, strict=True))
        )
    raise TypeError(f"config annotation {annotation} has no JSON reading here (model_config._matches)")


def _describe(annotation) -> str:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(arg) for arg in args)
    if annotation is type(None):
        return "null"
    if origin is list:
        return f"a list of {_describe(args[0])}"
    if origin is tuple:
        return f"a list [{', '.join(_describe(arg) for arg in args)}]"
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string"}[annotation]
