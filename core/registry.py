"""Name -> class registries for pluggable parts (policies, strategies, datalets, ...).

A plain mapping that refuses a name registered twice and answers an unknown name with the
valid ones, so a typo on the command line becomes a one-line error (as torchtitan's does).

    STRATEGIES = Registry("strategy")

    @STRATEGIES.register("fedavg")        # or STRATEGIES.add(cls) when cls.name is set
    class FedAvg(Strategy): ...

    STRATEGIES.get("fedavg")              # -> FedAvg; UnknownNameError naming the choices otherwise
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from mlsyskit.core.config import ConfigError

T = TypeVar("T")


class UnknownNameError(ConfigError, KeyError):
    """An unknown registry name; a ConfigError for CLIs and a KeyError for mapping-style callers."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class Registry(Generic[T]):
    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, type[T]] = {}

    def add(self, cls: type[T], name: str | None = None) -> type[T]:
        """Register `cls` under `name` (default: its `name` attribute)."""
        key = name if name is not None else getattr(cls, "name", None)
        if not isinstance(key, str) or not key:
            raise ValueError(f"{self.kind} {cls.__name__} needs a name")
        if key in self._items:
            raise ValueError(f"{self.kind} {key!r} is registered twice")
        self._items[key] = cls
        return cls

    def register(self, name: str | None = None) -> Callable[[type[T]], type[T]]:
        """Class decorator form of `add`."""
        return lambda cls: self.add(cls, name)

    def get(self, name: str) -> type[T]:
        try:
            return self._items[name]
        except KeyError:
            raise UnknownNameError(f"unknown {self.kind} {name!r}; choose from {', '.join(self.names())}") from None

    __getitem__ = get

    def names(self) -> list[str]:
        return sorted(self._items)

    def items(self) -> list[tuple[str, type[T]]]:
        return sorted(self._items.items())

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._items)
