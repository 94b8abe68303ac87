"""The data plane: single-server stores behind a node (memory, lmdb, redis) behind one Datalet API,
and their registry (CLI names to classes; adding a datalet is one class and one line here).

May import client.pipeline (the redis datalet's connection), redis (the memory datalet keeps lists
live: redis/livelist.py) and mlsyskit.core; only node and ops (which build a node's datalet) import it.
"""
from __future__ import annotations

from typing import Any

from mlsyskit.core.registry import Registry
from mlsyskit.tools.kv.datalets.base import Datalet, ScanUnsupported
from mlsyskit.tools.kv.datalets.lmdb_store import LmdbDatalet
from mlsyskit.tools.kv.datalets.memory import MemoryDatalet
from mlsyskit.tools.kv.datalets.redis_store import RedisDatalet

DATALETS: Registry[Datalet] = Registry("datalet")
register = DATALETS.add
for _cls in (MemoryDatalet, LmdbDatalet, RedisDatalet):
    register(_cls)


def make_datalet(name: str, **options: Any) -> Datalet:
    return DATALETS.get(name)(**options)


__all__ = ["DATALETS", "Datalet", "ScanUnsupported", "make_datalet", "register"]
