"""Replication and consistency as pure state machines, and their registry: (topology, consistency)
and CLI names to classes.

Owns the controlet interface (base: events in, actions out), the four protocols (ms_sc, ms_ec,
aa_sc, aa_ec with its switch entry and exit), catch-up of a numbered stream (stream, streamtail,
streamlog) and the learner. No sockets, clocks or files: node/interpreter.py carries out their
actions for the runtime and the simulator alike. May import only redis (the value format),
kv.shardmap and mlsyskit.core.
"""
from __future__ import annotations

from mlsyskit.core.config import ConfigError
from mlsyskit.core.registry import Registry
from mlsyskit.tools.kv.controlets.aa_ec import LastWriterWins
from mlsyskit.tools.kv.controlets.aa_sc import SequencedActiveActive
from mlsyskit.tools.kv.controlets.base import Controlet
from mlsyskit.tools.kv.controlets.ms_ec import AsyncPrimaryBackup
from mlsyskit.tools.kv.controlets.ms_sc import ChainReplication

CONTROLETS: Registry[Controlet] = Registry("controlet")
register = CONTROLETS.add
for _cls in (ChainReplication, AsyncPrimaryBackup, SequencedActiveActive, LastWriterWins):
    register(_cls)


def controlet_class(name: str) -> type[Controlet]:
    return CONTROLETS.get(name)


def controlet_name(topology: str, consistency: str) -> str:
    short = {"strong": "sc", "eventual": "ec"}
    if topology not in ("ms", "aa") or consistency not in short:
        raise ConfigError(f"topology must be ms|aa and consistency strong|eventual, got {topology}/{consistency}")
    return f"{topology}-{short[consistency]}"


__all__ = ["CONTROLETS", "Controlet", "controlet_class", "controlet_name", "register"]
