"""The datalet API on all three datalets: get/put/del/exists, export/import, scan, persistence."""
from __future__ import annotations

import asyncio

import pytest

from mlsyskit.core.config import ConfigError
from mlsyskit.tools.kv.datalets import DATALETS, ScanUnsupported, make_datalet


def open_datalet(name: str, tmp_path, request, db: int):
    if name == "memory":
        return make_datalet("memory")
    if name == "lmdb":
        return make_datalet("lmdb", path=tmp_path / "lmdb")
    return make_datalet("redis", host="127.0.0.1", port=request.getfixturevalue("redis_port"), db=db)


async def maybe(x):
    return await x if asyncio.isfuture(x) else x


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n == "redis" else n  # a redis-server
                                  for n in sorted(DATALETS)])
def test_datalet_api(name: str, tmp_path, request) -> None:
    async def body() -> None:
        d = open_datalet(name, tmp_path, request, db=60)
        await d.open()
        if name == "redis":
            await d.flush()
        try:
            assert await maybe(d.get(b"a")) is None
            await maybe(d.put(b"a", b"1"))
            await maybe(d.put(b"a", b"2"))
            assert await maybe(d.get(b"a")) == b"2"
            assert await maybe(d.exists(b"a")) and not await maybe(d.exists(b"b"))
            assert await maybe(d.delete(b"a")) and not await maybe(d.delete(b"a"))
            pairs = [(b"k%04d" % i, b"v%d" % i) for i in range(2500)]
            assert await d.import_pairs(pairs) == 2500
            exported = sorted([p async for p in d.export_pairs()])
            assert exported == pairs and await d.count() == 2500
            if d.ordered:
                assert d.scan(b"k0100", 3) == pairs[100:103]
                assert d.scan(b"z") == []
            else:
                with pytest.raises(ScanUnsupported):
                    d.scan()
            # Recovery path: export from one datalet into a fresh one.
            fresh = make_datalet("memory")
            await fresh.import_pairs([p async for p in d.export_pairs()])
            assert fresh.data == dict(pairs)
        finally:
            await d.close()

    asyncio.run(asyncio.wait_for(body(), 60))


def test_lmdb_persists_across_reopen(tmp_path) -> None:
    async def body() -> None:
        d = make_datalet("lmdb", path=tmp_path / "db")
        await d.open()
        d.put(b"durable", b"yes")
        d.put(b"gone", b"x")
        d.delete(b"gone")
        await d.close()
        again = make_datalet("lmdb", path=tmp_path / "db")
        await again.open()
        assert again.get(b"durable") == b"yes" and again.get(b"gone") is None and again.size() == 1
        await again.close()

    asyncio.run(body())


def test_unknown_datalet_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="unknown datalet 'rocksdb'"):
        make_datalet("rocksdb")
