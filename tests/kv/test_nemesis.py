"""The nemesis schedule (pure, seeded) and the fault-injecting proxy that partitions links."""
from __future__ import annotations

import asyncio
import itertools

import pytest

from mlsyskit.tools.kv.check.faultproxy import FaultProxy
from mlsyskit.tools.kv.check.nemesis import FAULTS, parse_faults, schedule


def run(coro, timeout: float = 30):
    return asyncio.run(asyncio.wait_for(coro, timeout))


def test_schedule_is_a_function_of_the_seed_and_covers_every_kind_each_round() -> None:
    nodes = ["a", "b", "c"]
    k = len(FAULTS)
    first = list(itertools.islice(schedule(FAULTS, nodes, seed=7), 3 * k))
    assert first == list(itertools.islice(schedule(FAULTS, nodes, seed=7), 3 * k))
    assert first != list(itertools.islice(schedule(FAULTS, nodes, seed=8), 3 * k))
    for r in range(3):
        assert sorted(f.kind for f in first[k * r:k * r + k]) == sorted(FAULTS)
    assert all(f.node in nodes and f.gap >= 0 for f in first)
    assert all((f.hold == 0) == (f.kind == "restart") for f in first)
    assert list(schedule((), nodes, seed=1)) == []


def test_parse_faults() -> None:
    assert parse_faults("kill, pause,kill") == ("kill", "pause")
    assert parse_faults("none") == ()
    with pytest.raises(ValueError, match="unknown nemesis explode"):
        parse_faults("kill,explode")


async def _echo_server():
    async def echo(reader, writer):
        while data := await reader.read(1024):
            writer.write(data)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def _roundtrip(port: int, payload: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(payload)
    data = await asyncio.wait_for(reader.readexactly(len(payload)), 5)
    writer.close()
    return data


@pytest.mark.slow
def test_proxy_relays_and_a_partition_resets_and_refuses_until_healed() -> None:
    async def body() -> None:
        server, port = await _echo_server()
        proxy = FaultProxy(("127.0.0.1", port))
        await proxy.start()
        try:
            assert await _roundtrip(proxy.port, b"hello") == b"hello"
            reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
            writer.write(b"x")
            assert await reader.readexactly(1) == b"x"
            await proxy.sever()
            # the connection in flight is reset: EOF or a reset, never the echo
            try:
                writer.write(b"lost")
                await writer.drain()
                got = await asyncio.wait_for(reader.read(10), 5)
            except OSError:
                got = b""
            assert got == b""
            with pytest.raises(OSError):  # new connections are refused while severed
                await _roundtrip(proxy.port, b"again")
            old_port = proxy.port
            await proxy.heal()
            assert proxy.port == old_port and await _roundtrip(proxy.port, b"back") == b"back"
            assert proxy.stats["severed"] == 1 and proxy.stats["resets"] >= 1
        finally:
            await proxy.close()
            server.close()
            await server.wait_closed()

    run(body())


@pytest.mark.slow
def test_proxy_to_a_dead_target_resets_the_caller() -> None:
    async def body() -> None:
        server, port = await _echo_server()
        server.close()
        await server.wait_closed()
        proxy = FaultProxy(("127.0.0.1", port))
        await proxy.start()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
            try:
                writer.write(b"anyone?")
                await writer.drain()
                assert await asyncio.wait_for(reader.read(10), 5) == b""
            except OSError:
                pass
        finally:
            await proxy.close()

    run(body())


@pytest.mark.slow
def test_cluster_faults_and_stop_leave_no_process_behind(tmp_path) -> None:
    from mlsyskit.tools.kv.check.procs import ProcCluster
    from mlsyskit.tools.kv.client.call import acall

    async def body() -> None:
        cluster = ProcCluster("ms-ec", "memory", 1, 3, tmp_path / "c", partitionable=True)
        await cluster.start()
        procs = dict(cluster.procs)
        try:
            master, slave, other = cluster.map.shards[0]
            maddr = cluster.map.nodes[master]
            assert await acall(maddr.host, maddr.port, b"SET", b"k", b"v") == b"OK"
            # replication really flows through the proxies (else a partition would cut nothing)
            for dst in (slave, other):
                proxy = cluster.proxies[(master, dst)]
                for _ in range(100):
                    if proxy.stats["bytes"]:
                        break
                    await asyncio.sleep(0.02)  # poll with a deadline
                assert proxy.stats["bytes"] > 0
            await cluster.kill(slave)
            assert procs[slave].returncode == -9
            cluster.pause(other)
            await cluster.isolate(master)
            assert all(p.severed for (s, d), p in cluster.proxies.items() if master in (s, d))
            await cluster.heal()  # resumes, reconnects and restarts
            assert cluster.alive(slave) and not cluster.paused
            addr = cluster.map.nodes[other]
            assert await acall(addr.host, addr.port, b"PING") == b"PONG"
            procs.update(cluster.procs)
        finally:
            await cluster.stop()
        assert all(p.poll() is not None for p in [*procs.values(), *cluster.procs.values()])
        assert all(p.severed for p in cluster.proxies.values())

    run(body(), timeout=90)
