"""Config is data: frozen dataclasses loaded from TOML, CLI flags over file over defaults.

    @dataclass(frozen=True)
    class TrainConfig:
        steps: int = 10
        lr: float = 1e-3
        def __post_init__(self): require(self.steps > 0, "steps must be positive")

    cfg = load_config(TrainConfig, path="train.toml", overrides={"steps": 50})

Unknown keys are rejected with a message naming the key and the valid ones; values are
checked against the field types by pydantic (a TypeAdapter over the frozen dataclass: int,
float, str, bool, Path, Literal, nested dataclasses, lists, tuples, dicts, Optional), floats
must be finite unless a field is Annotated with pydantic.AllowInfNan(). Validation beyond
types lives in each dataclass's __post_init__.
"""
from __future__ import annotations

import dataclasses
import functools
import re
import tomllib
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from mlsyskit.core.errors import UsageError

if TYPE_CHECKING:
    import pydantic

T = TypeVar("T")


class ConfigError(UsageError, ValueError):
    """A config file or override that does not fit its dataclass (a usage error: exit 2)."""


def require(condition: bool, message: str) -> None:
    """Validation helper for __post_init__: raises ConfigError(message) when false."""
    if not condition:
        raise ConfigError(message)


_SIZE_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
               "t": 1000**4, "tb": 1000**4, "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4}


def parse_size(text: str | int) -> int:
    """'2GiB' -> 2147483648, '512MB' -> 512000000, 4096 -> 4096."""
    if isinstance(text, int):
        if text < 0:
            raise ConfigError(f"size must be non-negative, got {text}")
        return text
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _SIZE_UNITS:
        raise ConfigError(f"cannot parse size {text!r}: use e.g. 4096, 512MiB, 2GiB or 1.5GB")
    return int(float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()])


def format_size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n} B"


def load_toml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: invalid TOML: {e}") from None


def load_config(cls: type[T], path: str | Path | None = None, overrides: Mapping[str, Any] | None = None,
                section: str | None = None) -> T:
    """Defaults, then the TOML file (optionally one [section] of it), then non-None overrides."""
    data: dict[str, Any] = {}
    if path is not None:
        raw = load_toml(path)
        if section is not None:
            raw = raw.get(section, {})
            if not isinstance(raw, dict):
                raise ConfigError(f"{path}: [{section}] must be a table")
        data = dict(raw)
    for key, value in (overrides or {}).items():
        if value is not None:
            _set_dotted(data, key, value)
    return from_dict(cls, data)


def _set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    for p in parts[:-1]:
        data = data.setdefault(p, {})
    data[parts[-1]] = value


def from_dict(cls: type[T], data: Mapping[str, Any], where: str = "") -> T:
    """Build the dataclass `cls` from plain data (TOML tables, CLI overrides), type-checked by pydantic."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls} is not a dataclass")
    _reject_unknown_keys(cls, data, where)
    import pydantic  # at the first config read, not at import: a process that reads none (a kv node) never pays ~0.1 s

    try:
        return _adapter(cls).validate_python(dict(data))
    except pydantic.ValidationError as e:
        raise ConfigError(_describe(e.errors()[0], where)) from None
    except TypeError as e:  # e.g. a required field with no default and no value
        raise ConfigError(f"{cls.__name__}: {e}") from None


@functools.cache
def _adapter(cls: type) -> pydantic.TypeAdapter:
    import pydantic

    _finite_floats(cls)
    return pydantic.TypeAdapter(cls)


def _finite_floats(cls: type) -> None:
    """Finite floats unless a field says otherwise (Annotated[float, pydantic.AllowInfNan()]).

    pydantic reads a stdlib dataclass's config from `__pydantic_config__`; a class that sets
    its own keeps it.
    """
    import pydantic

    if "__pydantic_config__" not in vars(cls):
        cls.__pydantic_config__ = pydantic.ConfigDict(allow_inf_nan=False)  # type: ignore[attr-defined]
    for tp in typing.get_type_hints(cls).values():
        for candidate in (tp, *typing.get_args(tp)):
            if dataclasses.is_dataclass(candidate) and candidate is not cls:
                _finite_floats(candidate)


def _reject_unknown_keys(cls: type, data: Any, where: str) -> None:
    """Unknown keys named with the valid ones, at any depth of nested dataclasses."""
    if not isinstance(data, Mapping):
        return
    hints = typing.get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - fields)
    if unknown:
        raise ConfigError(f"unknown config key{'s' if len(unknown) > 1 else ''} "
                          f"{', '.join(repr(where + str(k)) for k in unknown)}; valid keys: {', '.join(sorted(fields))}")
    for name, value in data.items():
        nested = _dataclass_in(hints[name])
        if nested is not None and isinstance(value, Mapping):
            _reject_unknown_keys(nested, value, f"{where}{name}.")


def _dataclass_in(tp: Any) -> type | None:
    if dataclasses.is_dataclass(tp):
        return tp
    for arg in typing.get_args(tp):  # Optional[Inner], Inner | None
        if dataclasses.is_dataclass(arg):
            return arg
    return None


_EXPECTED = {"int": "expected an integer", "bool": "expected true/false", "float": "expected a number",
             "string": "expected a string", "dict": "expected a table", "list": "expected a list",
             "tuple": "expected a list", "path": "expected a path", "dataclass": "expected a table"}


def _describe(error: Mapping[str, Any], where: str) -> str:
    """One pydantic error as a one-line message in this module's words."""
    loc = [str(part) for part in error.get("loc", ()) if not str(part).startswith(("function-", "lax-", "json-"))]
    name = where + ".".join(loc) if loc else where.rstrip(".")
    kind = str(error.get("type", ""))
    given = error.get("input")
    if kind == "value_error" and "error" in error.get("ctx", {}):
        return str(error["ctx"]["error"])
    if kind == "finite_number":
        return f"{name}: expected a finite number, got {given!r}"
    if kind == "literal_error":
        return f"{name}: {given!r} is not one of {error.get('ctx', {}).get('expected', '')}"
    for prefix, words in _EXPECTED.items():
        if kind.startswith(prefix + "_"):
            return f"{name}: {words}, got {given!r}"
    return f"{name}: {error.get('msg', 'bad value')} (got {given!r})"
