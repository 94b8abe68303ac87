"""Datalet registry: CLI names to classes. Adding a datalet is one class and one line here."""
from __future__ import annotations

from typing import Any

from mlsyskit.core.config import ConfigError
from mlsyskit.tools.kv.datalets.base import Datalet, ScanUnsupported
from mlsyskit.tools.kv.datalets.lmdb_store import LmdbDatalet
from mlsyskit.tools.kv.datalets.memory import MemoryDatalet
from mlsyskit.tools.kv.datalets.redis_store import RedisDatalet

DATALETS: dict[str, type[Datalet]] = {}


def register(cls: type[Datalet]) -> type[Datalet]:
    if cls.name in DATALETS:
        raise ValueError(f"datalet {cls.name!r} registered twice")
    DATALETS[cls.name] = cls
    return cls


for _cls in (MemoryDatalet, LmdbDatalet, RedisDatalet):
    register(_cls)


def make_datalet(name: str, **options: Any) -> Datalet:
    if name not in DATALETS:
        raise ConfigError(f"unknown datalet {name!r}; choose from {', '.join(sorted(DATALETS))}")
    return DATALETS[name](**options)


__all__ = ["DATALETS", "Datalet", "ScanUnsupported", "make_datalet", "register"]
