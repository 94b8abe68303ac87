"""The data-path reproductions of issue 14 on real sockets: restarts, datalet errors, bad arguments."""
from __future__ import annotations

import asyncio

import hiredis
import pytest

from mlsyskit.tools.kv.client.pipeline import RespConnection
from mlsyskit.tools.kv.client.smart import SmartClient
from mlsyskit.tools.kv.controlets.base import ControletOptions
from mlsyskit.tools.kv.datalets.memory import MemoryDatalet
from mlsyskit.tools.kv.node.requests import Request
from mlsyskit.tools.kv.ops.cluster import LocalCluster
from tests.kv.conftest import datalet_factory, make_map

pytestmark = pytest.mark.slow  # every test here starts servers, clusters or processes

FAST = ControletOptions(write_timeout=0.5, sync_timeout=0.2, anti_entropy_interval=0.1)


def run(coro, timeout: float = 60):
    return asyncio.run(asyncio.wait_for(coro, timeout))


async def connect(smap, node: str) -> RespConnection:
    a = smap.nodes[node]
    return await RespConnection.connect(a.host, a.port)


async def digests(smap, nodes) -> dict:
    out = {}
    for n in nodes:
        c = await connect(smap, n)
        out[n] = tuple(await c.call(b"BKV.DIGEST"))
        await c.close()
    return out


async def until(condition, timeout: float = 10.0, what: str = "condition") -> None:
    """Poll an async condition with a deadline (never a fixed sleep)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await condition():
        if loop.time() > deadline:
            raise AssertionError(f"{what} not reached within {timeout}s")
        await asyncio.sleep(0.02)


def test_chain_repro_kill_the_middle_then_restart_it(tmp_path) -> None:
    """SET x1 old; kill -9 the middle; SET x1 new (was: hung, then OK while the tail kept `old`)."""
    async def body() -> None:
        smap = make_map("ms-sc", shards=1, replicas=3)
        async with LocalCluster(smap, datalet_factory("memory", tmp_path), options=FAST) as cluster:
            head, tail = await connect(smap, "s0r0"), await connect(smap, "s0r2")
            assert await head.call(b"SET", b"x1", b"old") == b"OK"
            await cluster.kill("s0r1")
            with pytest.raises(hiredis.ReplyError, match="TRYAGAIN"):
                await head.call(b"SET", b"x1", b"new")
            await cluster.restart("s0r1")
            assert await head.call(b"SET", b"x2", b"v2") == b"OK"
            assert await tail.call(b"GET", b"x2") == b"v2"

            async def same() -> bool:
                return len(set((await digests(smap, smap.shards[0])).values())) == 1
            await until(same, what="equal replica digests")
            assert await tail.call(b"GET", b"x1") == b"new"  # the unknown write took effect everywhere
            assert Request.duplicate_completions == 0
            await head.close()
            await tail.close()

    run(body())


@pytest.mark.parametrize("controlet", ["aa-sc", "ms-ec"])
def test_a_restarted_empty_replica_catches_up_before_serving(controlet: str, tmp_path) -> None:
    async def body() -> None:
        smap = make_map(controlet, shards=1, replicas=3)
        async with LocalCluster(smap, datalet_factory("memory", tmp_path), options=FAST) as cluster:
            client = SmartClient(smap, seed=1)
            for i in range(200):
                await client.put(b"k%d" % i, b"v%d" % i)
            await cluster.kill("s0r2")
            node = await cluster.restart("s0r2")
            assert node.controlet.syncs == 1
            conn = await connect(smap, "s0r2")
            if controlet == "ms-ec":  # eventual: the slave applied the master's state as of its snapshot
                assert await conn.call(b"GET", b"k199") == b"v199"
            else:
                assert [await conn.call(b"GET", b"k%d" % i) for i in range(0, 200, 20)] == \
                    [b"v%d" % i for i in range(0, 200, 20)]
            assert len(set((await digests(smap, smap.shards[0])).values())) == 1
            await conn.close()
            await client.close()

    run(body())


def test_active_active_eventual_survives_a_full_restart_and_repairs_by_anti_entropy(tmp_path) -> None:
    """Versions live in the lmdb values: after every node restarts, replicas still agree on which
    write wins, and a replica that lost writes (killed, its messages gone) is repaired."""
    smap = make_map("aa-ec", "lmdb", shards=1, replicas=3)

    async def write_and_stop() -> None:
        async with LocalCluster(smap, datalet_factory("lmdb", tmp_path), options=FAST) as cluster:
            conns = [await connect(smap, n) for n in smap.shards[0]]
            for i in range(60):
                assert await conns[i % 3].call(b"SET", b"k%d" % (i % 20), b"w%d" % i) == b"OK"
            await cluster.kill("s0r1")
            for i in range(60, 80):  # s0r1 misses these
                assert await conns[0].call(b"SET", b"k%d" % (i % 20), b"w%d" % i) == b"OK"
            for c in conns:
                await c.close()

    async def restart_and_check() -> None:
        async with LocalCluster(smap, datalet_factory("lmdb", tmp_path), options=FAST) as cluster:
            async def same() -> bool:
                return len(set((await digests(smap, smap.shards[0])).values())) == 1
            await until(same, what="anti-entropy convergence")
            conn = await connect(smap, "s0r1")
            assert [await conn.call(b"GET", b"k%d" % i) for i in range(20)] == [b"w%d" % (60 + i) for i in range(20)]
            assert cluster.nodes["s0r1"].controlet.repaired + cluster.nodes["s0r0"].controlet.repaired > 0
            await conn.close()

    run(write_and_stop())
    run(restart_and_check())


class FailingDatalet(MemoryDatalet):
    """A memory datalet whose writes of one key fail, as a redis datalet under maxmemory does."""

    def __init__(self, poison: bytes) -> None:
        super().__init__()
        self.poison = poison
        plain = self.data.__setitem__

        def put(key: bytes, value: bytes) -> None:
            if key == self.poison:
                raise MemoryError("OOM command not allowed when used memory > 'maxmemory'")
            plain(key, value)
        self.put = put  # type: ignore[method-assign]


class AsyncFailingDatalet(FailingDatalet):
    """The same, answering with futures (the remote-datalet path of the runtime)."""

    is_async = True

    def _future(self, fn, *args):
        fut = asyncio.get_running_loop().create_future()
        try:
            fut.set_result(fn(*args))
        except Exception as e:  # noqa: BLE001
            fut.set_exception(e)
        return fut

    def __init__(self, poison: bytes) -> None:
        super().__init__(poison)
        sync_get, sync_put = self.get, self.put
        self.get = lambda k: self._future(sync_get, k)  # type: ignore[method-assign]
        self.put = lambda k, v: self._future(sync_put, k, v)  # type: ignore[method-assign]

    def delete(self, key):
        return self._future(MemoryDatalet.delete, self, key)

    def exists(self, key):
        return self._future(MemoryDatalet.exists, self, key)


@pytest.mark.parametrize("datalet", [FailingDatalet, AsyncFailingDatalet])
def test_a_datalet_error_fails_the_whole_request_exactly_once(datalet, tmp_path) -> None:
    async def body() -> None:
        smap = make_map("ms-sc", shards=1, replicas=3)
        before = Request.duplicate_completions
        head_only = {"s0r0": lambda: datalet(b"poison")}
        cluster = LocalCluster(smap, lambda n: head_only.get(n, lambda: MemoryDatalet())(), options=FAST)
        async with cluster:
            conn = await connect(smap, "s0r0")
            with pytest.raises(hiredis.ReplyError, match="datalet error.*OOM"):
                await conn.call(b"SET", b"poison", b"v")
            tail = cluster.nodes["s0r2"].datalet
            assert b"poison" not in tail.data and b"poison" not in cluster.nodes["s0r1"].datalet.data
            # The connection is still usable and its reads do not wait forever.
            assert await conn.call(b"SET", b"fine", b"1") == b"OK"
            assert await conn.call(b"GET", b"fine") == b"1"
            assert await asyncio.wait_for(conn.call(b"GET", b"poison"), 5) is None
            assert cluster.nodes["s0r0"].stats["datalet_errors"] == 1
            assert Request.duplicate_completions == before
            await conn.close()

    run(body())


@pytest.mark.parametrize("frame", [
    b"*3\r\n$3\r\nSET\r\n$6\r\npoison\r\n*1\r\n$1\r\nx\r\n",  # an array argument
    b"*3\r\n$3\r\nSET\r\n$6\r\npoison\r\n:5\r\n",  # an integer argument
    b"*3\r\n$3\r\nSET\r\n$6\r\npoison\r\n$-1\r\n",  # a nil argument
    b"*2\r\n$3\r\nGET\r\n*1\r\n$1\r\nx\r\n",  # an array key on the GET fast path
])
@pytest.mark.parametrize("controlet", ["ms-sc", "aa-sc"])
def test_non_bulk_arguments_are_refused_and_never_stored(frame: bytes, controlet: str, tmp_path) -> None:
    async def body() -> None:
        smap = make_map(controlet, shards=1, replicas=1 if controlet == "ms-sc" else 3)
        async with LocalCluster(smap, datalet_factory("memory", tmp_path)) as cluster:
            first = smap.shards[0][0]
            a = smap.nodes[first]
            reader, writer = await asyncio.open_connection(a.host, a.port)
            writer.write(frame)
            line = await asyncio.wait_for(reader.readline(), 5)
            assert line.startswith(b"-ERR Protocol error: expected an array of bulk strings")
            assert await asyncio.wait_for(reader.read(), 5) == b""  # closed, as Redis does
            writer.close()
            conn = await connect(smap, first)
            assert await conn.call(b"GET", b"poison") is None
            assert (await conn.call(b"BKV.DIGEST"))[0] == b"0"
            assert all(n.datalet.size() == 0 for n in cluster.nodes.values())
            await conn.close()

    run(body())


def test_redis_datalet_under_maxmemory_fails_the_write_and_replicates_nothing(tmp_path, redis_port) -> None:
    """The issue's repro: the head's redis-server is full (maxmemory, noeviction); the client gets
    the OOM error, middle and tail do not apply the write, and the connection's next read answers."""
    import redis as redis_py

    from mlsyskit.tools.kv.ops.cluster import node_datalet
    from tests.conftest import ProcManager, free_port, wait_for_port

    manager = ProcManager()
    full_port = free_port()
    proc = manager.start(["redis-server", "--port", str(full_port), "--bind", "127.0.0.1", "--save", "",
                          "--appendonly", "no", "--maxmemory-policy", "noeviction"])
    try:
        wait_for_port(full_port, proc=proc)
        filler = redis_py.Redis(port=full_port)
        for i in range(1000):
            filler.set(f"fill{i}", b"x" * 4096)
        filler.config_set("maxmemory", "1mb")  # now well over it: every write is refused
        with pytest.raises(redis_py.ResponseError, match="maxmemory"):
            filler.set("probe", "1")
        filler.close()
        dbs = {"s0r1": 40, "s0r2": 41}

        def datalet(node: str):
            if node == "s0r0":
                return node_datalet("redis", node, redis={"port": full_port})
            return node_datalet("redis", node, redis={"port": redis_port, "db": dbs[node]})

        async def body() -> None:
            for db in dbs.values():
                r = redis_py.Redis(port=redis_port, db=db)
                r.flushdb()
                r.close()
            smap = make_map("ms-sc", "redis", shards=1, replicas=3)
            before = Request.duplicate_completions
            async with LocalCluster(smap, datalet, options=FAST) as cluster:
                conn = await connect(smap, "s0r0")
                with pytest.raises(hiredis.ReplyError, match="OOM"):
                    await conn.call(b"SET", b"x", b"v")
                assert await asyncio.wait_for(conn.call(b"GET", b"x"), 5) is None  # no hang after the error
                for node in ("s0r1", "s0r2"):
                    assert await cluster.nodes[node].datalet.get(b"x") is None
                assert Request.duplicate_completions == before
                await conn.close()

        run(body())
    finally:
        manager.stop_all()
