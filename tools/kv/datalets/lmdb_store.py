"""`lmdb`: a persistent, ordered, memory-mapped B+tree (the `lmdb` package).

Each put/delete is its own write transaction; with `sync=False` (the default here) LMDB
does not fsync per commit, so a process crash loses nothing but a machine crash may lose
the last commits; `sync=True` makes every write durable before it is acknowledged.
"""
from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import lmdb

from mlsyskit.core.config import parse_size
from mlsyskit.tools.kv.datalets.base import Datalet


class LmdbDatalet(Datalet):
    name = "lmdb"
    ordered = True

    def __init__(self, path: str | Path, map_size: str | int = "4GiB", sync: bool = False) -> None:
        self.path = Path(path)
        self.map_size = parse_size(map_size) if isinstance(map_size, str) else int(map_size)
        self.sync = sync
        self.env: lmdb.Environment | None = None

    async def open(self) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        self.env = lmdb.open(str(self.path), map_size=self.map_size, sync=self.sync,
                             metasync=self.sync, max_dbs=0, lock=True)

    async def close(self) -> None:
        if self.env is not None:
            self.env.sync(True)
            self.env.close()
            self.env = None

    def get(self, key: bytes) -> bytes | None:
        with self.env.begin(buffers=False) as txn:
            return txn.get(key)

    def put(self, key: bytes, value: bytes) -> None:
        with self.env.begin(write=True) as txn:
            txn.put(key, value if value.__class__ is bytes else bytes(value))  # a live value: its bytes

    def delete(self, key: bytes) -> bool:
        with self.env.begin(write=True) as txn:
            return txn.delete(key)

    def clear(self) -> None:
        with self.env.begin(write=True) as txn:
            txn.drop(self.env.open_db(txn=txn), delete=False)

    def exists(self, key: bytes) -> bool:
        with self.env.begin() as txn:
            return txn.get(key) is not None

    def size(self) -> int:
        return self.env.stat()["entries"] if self.env is not None else 0

    def export_now(self) -> AsyncIterator[tuple[bytes, bytes]]:
        txn = self.env.begin(buffers=False)  # a read view of this instant (MVCC), held until the export ends

        async def pairs() -> AsyncIterator[tuple[bytes, bytes]]:
            try:
                for pair in txn.cursor():
                    yield pair
            finally:
                txn.abort()
        return pairs()

    async def export_pairs(self) -> AsyncIterator[tuple[bytes, bytes]]:
        start = b""
        while True:
            batch = self.scan(start, 1000)
            for pair in batch:
                yield pair
            if len(batch) < 1000:
                return
            start = batch[-1][0] + b"\x00"

    def scan(self, start: bytes = b"", limit: int = 100) -> list[tuple[bytes, bytes]]:
        out: list[tuple[bytes, bytes]] = []
        with self.env.begin() as txn:
            cur = txn.cursor()
            if not cur.set_range(start):
                return out
            for key, value in cur:
                out.append((key, value))
                if len(out) >= limit:
                    break
        return out
