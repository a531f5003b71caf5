"""YAML + dotted overrides -> nested frozen dataclasses, with errors that name the offending key.

Why a loader of our own instead of Hydra/OmegaConf: a training config is a contract between a YAML file, the
command line and the code, and the only failure users hit in practice is a typo or a wrong type. Here every
key is checked against the dataclass fields (unknown keys name the closest valid one), every value against the
field's annotation (``int``, ``float``, ``bool``, ``str``, ``X | None``, ``tuple[...]``, ``dict``, nested
dataclasses), and range checks live in each dataclass's ``__post_init__``. Errors are ``ValueError`` with the
dotted path, e.g. ``optim.lr: expected a number, got 'fast'``.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml

T = TypeVar("T")
_YAML11_FLOAT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")


def load_yaml(path: str | Path) -> dict[str, Any]:
    """The mapping at the top of a YAML file (an empty file is an empty mapping)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"config file {str(path)!r} does not exist")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ValueError(f"{path}: invalid YAML ({err})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: the top level must be a mapping of keys, got {type(data).__name__}")
    return data


def apply_overrides(data: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """``["optim.lr=1e-5", "data.group_size=4"]`` applied to a copy of ``data``; values are parsed as YAML."""
    out = _deep_copy(data)
    for item in overrides:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"override {item!r} must look like key.sub=value")
        try:
            value = yaml.safe_load(raw) if raw.strip() else None
        except yaml.YAMLError:
            value = raw
        node = out
        parts = key.split(".")
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ValueError(f"override {item!r}: {part!r} is a value, not a section")
            node = child
        node[parts[-1]] = value
    return out


def _deep_copy(data: Any) -> Any:
    if isinstance(data, dict):
        return {k: _deep_copy(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_deep_copy(v) for v in data]
    return data


def from_dict(cls: type[T], data: Mapping[str, Any] | None, path: str = "") -> T:
    """Build dataclass ``cls`` from a mapping, checking keys and value types recursively."""
    data = {} if data is None else data
    if not isinstance(data, Mapping):
        raise ValueError(f"{path or 'config'}: expected a mapping of keys, got {_show(data)}")
    fields = {f.name: f for f in dataclasses.fields(typing.cast(Any, cls)) if f.init}
    hints = typing.get_type_hints(cls)
    unknown = [k for k in data if k not in fields]
    if unknown:
        key = unknown[0]
        close = difflib.get_close_matches(str(key), list(fields), n=1)
        hint = f"; did you mean {_join(path, close[0])!r}?" if close else ""
        raise ValueError(f"unknown config key {_join(path, str(key))!r}{hint} "
                         f"(valid keys here: {', '.join(sorted(fields))})")
    kwargs = {name: _section(fields[name], hints[name], data[name], _join(path, name)) for name in data}
    missing = [n for n, f in fields.items() if n not in kwargs and f.default is dataclasses.MISSING
               and f.default_factory is dataclasses.MISSING]
    if missing:
        raise ValueError(f"missing required config key {_join(path, missing[0])!r}")
    try:
        return cls(**kwargs)
    except ValueError as err:
        msg = str(err)
        raise ValueError(msg if not path or msg.startswith(path) else f"{path}: {msg}") from None


def _section(f: dataclasses.Field, tp: Any, value: Any, path: str) -> Any:
    """A field's value; a nested section whose default is built by a factory overrides that default's keys
    (``engine: {dtype: float32}`` keeps the rest of the default engine, not the engine class's defaults)."""
    factory = f.default_factory
    if (isinstance(tp, type) and dataclasses.is_dataclass(tp) and isinstance(value, Mapping)
            and factory is not dataclasses.MISSING and factory is not tp):  # a default other than the class's
        base, parsed = factory(), from_dict(tp, value, path)
        return dataclasses.replace(base, **{name: getattr(parsed, name) for name in value})
    return _convert(tp, value, path)


def to_dict(obj: Any) -> Any:
    """A dataclass config as plain YAML/JSON-ready data (tuples become lists)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    if isinstance(obj, Mapping):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj


def _convert(tp: Any, value: Any, path: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return _convert(arg, value, path)
            except ValueError as err:
                errors.append(str(err))
        raise ValueError(errors[0] if len(errors) == 1 else f"{path}: {_show(value)} matches none of {tp}")
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return from_dict(tp, value, path)
    if tp is Any:
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{path}: expected true or false, got {_show(value)}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{path}: expected an integer, got {_show(value)}")
        return value
    if tp is float:
        if isinstance(value, str) and _YAML11_FLOAT.fullmatch(value.strip()):
            return float(value)  # PyYAML (YAML 1.1) reads 1e-5 as a string: accept it for number fields
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{path}: expected a number, got {_show(value)}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ValueError(f"{path}: expected a string, got {_show(value)}")
        return value
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"{path}: expected a list, got {_show(value)}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_convert(args[0], v, f"{path}[{i}]") for i, v in enumerate(value))
        if len(value) != len(args):
            raise ValueError(f"{path}: expected a list of {len(args)} values, got {len(value)}")
        return tuple(_convert(a, v, f"{path}[{i}]") for i, (a, v) in enumerate(zip(args, value)))
    if origin in (dict, Mapping) or tp is dict:
        if not isinstance(value, Mapping):
            raise ValueError(f"{path}: expected a mapping, got {_show(value)}")
        return dict(value)
    raise TypeError(f"{path}: unsupported config annotation {tp!r}")


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _show(value: Any) -> str:
    return f"{value!r} ({type(value).__name__})"
