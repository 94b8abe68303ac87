"""Controlet registry: (topology, consistency) and CLI names to classes."""
from __future__ import annotations

from mlsyskit.core.config import ConfigError
from mlsyskit.tools.kv.controlets.aa_ec import LastWriterWins
from mlsyskit.tools.kv.controlets.aa_sc import SequencedActiveActive
from mlsyskit.tools.kv.controlets.base import Controlet
from mlsyskit.tools.kv.controlets.ms_ec import AsyncPrimaryBackup
from mlsyskit.tools.kv.controlets.ms_sc import ChainReplication

CONTROLETS: dict[str, type[Controlet]] = {}


def register(cls: type[Controlet]) -> type[Controlet]:
    if cls.name in CONTROLETS:
        raise ValueError(f"controlet {cls.name!r} registered twice")
    CONTROLETS[cls.name] = cls
    return cls


for _cls in (ChainReplication, AsyncPrimaryBackup, SequencedActiveActive, LastWriterWins):
    register(_cls)


def controlet_class(name: str) -> type[Controlet]:
    if name not in CONTROLETS:
        raise ConfigError(f"unknown controlet {name!r}; choose from {', '.join(sorted(CONTROLETS))}")
    return CONTROLETS[name]


def controlet_name(topology: str, consistency: str) -> str:
    short = {"strong": "sc", "eventual": "ec"}
    if topology not in ("ms", "aa") or consistency not in short:
        raise ConfigError(f"topology must be ms|aa and consistency strong|eventual, got {topology}/{consistency}")
    return f"{topology}-{short[consistency]}"


__all__ = ["CONTROLETS", "Controlet", "controlet_class", "controlet_name", "register"]
