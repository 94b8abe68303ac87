"""A node's redis-server dies or stops: the redis datalet reports the store lost, the node fail-stops
and is failed over, and the supervisor restarts the redis-server, then the node (empty; it copies
the shard from a survivor). Before this, such a node kept heartbeating while every write failed
with a datalet error, so it was never failed over and an ms-sc chain stalled for ever."""
from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest

from mlsyskit.tools.kv.client.call import call
from mlsyskit.tools.kv.client.pipeline import ConnectionLost
from mlsyskit.tools.kv.datalets import make_datalet
from mlsyskit.tools.kv.ops import processes
from tests.conftest import ProcManager, free_port, wait_for_port
from tests.kv.conftest import needs_redis
from tests.kv.test_supervisor import (
    _all_pids,
    _down_leaves_nothing,
    _pids,
    _record,
    _replaced,
    _until,
    _up,
    _write,
)

pytestmark = pytest.mark.slow  # every test here starts servers, clusters or processes


def _redis(manager: ProcManager) -> tuple[int, object]:
    port = free_port()
    proc = manager.start(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                          "--appendonly", "no"])
    wait_for_port(port, proc=proc)
    return port, proc


@pytest.mark.parametrize("fault", ["kill", "stop"])
def test_the_datalet_reports_its_server_lost_and_fails_what_waits(fault: str) -> None:
    needs_redis()
    manager = ProcManager()
    port, proc = _redis(manager)

    async def body() -> tuple[list[str], BaseException | None, float]:
        lost: list[str] = []
        d = make_datalet("redis", host="127.0.0.1", port=port, stall_s=0.4)
        d.on_lost = lost.append
        await d.open()
        try:
            await d.put(b"a", b"1")
            assert await d.get(b"a") == b"1"
            os.kill(proc.pid, signal.SIGKILL if fault == "kill" else signal.SIGSTOP)
            loop = asyncio.get_running_loop()
            started = loop.time()
            pending = d.put(b"a", b"2")
            try:
                await asyncio.wait_for(pending, 10)
                error = None
            except ConnectionLost as e:
                error = e
            return lost, error, loop.time() - started
        finally:
            await d.close()

    try:
        lost, error, waited = asyncio.run(body())
    finally:
        if fault == "stop":
            os.kill(proc.pid, signal.SIGCONT)
        manager.stop_all()
    assert isinstance(error, ConnectionLost)  # the waiting write failed: never left hanging
    assert len(lost) == 1
    if fault == "kill":
        assert "closed the connection" in lost[0]
    else:
        assert "no reply for 0.4 s" in lost[0] and 0.4 <= waited < 5


def test_a_datalet_that_cannot_connect_says_where_and_for_how_long() -> None:
    needs_redis()
    d = make_datalet("redis", host="127.0.0.1", port=free_port(), connect_s=0.3)
    with pytest.raises(ConnectionRefusedError, match=r"refused connections for 0.3 s"):
        asyncio.run(d.open())


@pytest.mark.parametrize("fault", ["kill", "stop"])
def test_a_dead_or_stopped_redis_server_is_failed_over_and_replaced(tmp_path: Path, fault: str) -> None:
    """ms-sc on the redis datalet, supervised: the head's redis-server is killed -9 or SIGSTOPped.
    Writes go on through the failover, the supervisor restarts the store and the node, which joins
    again holding every acknowledged write."""
    needs_redis()
    d = tmp_path / "c"
    _up(d, "--datalet", "redis", ports=7)  # 3 redis-servers after the nodes
    seen = _all_pids(d)
    try:
        acked = asyncio.run(_write(d, range(0, 60), 30.0))
        pids = _pids(d)
        old_node, old_redis = pids["node:s0r0"], pids["redis:s0r0"]
        os.kill(old_redis, signal.SIGKILL if fault == "kill" else signal.SIGSTOP)
        acked |= asyncio.run(_write(d, range(60, 120), 30.0))  # through the fail-stop and the failover
        row = _until("the supervisor's replacement of s0r0 to serve", lambda: _replaced(d, "s0r0", old_node))
        seen |= _all_pids(d)
        assert _pids(d)["redis:s0r0"] != old_redis and row["role"] == "tail"
        assert len(acked) >= 100
        addr = _record(d)["map"]["nodes"]["s0r0"]  # the replacement is the tail: it serves reads
        missing = [k for k in sorted(acked) if call(addr["host"], addr["port"], "GET", k) != b"v" + k[1:]]
        assert missing == []
        log = (d / "logs" / "supervisor.log").read_text()
        assert "redis:s0r0 " in log and "node:s0r0 restart-empty" in log
        stores = {s["node"]: s for s in processes.store_status(d)}  # `bespokv status`'s redis-servers table
        assert stores["s0r0"]["up"] and stores["s0r0"]["restarts"] == 1 and stores["s0r1"]["restarts"] == 0
        node_log = (d / "logs" / "node-s0r0.log").read_text()
        assert "fail-stop" in node_log
    finally:
        if fault == "stop":
            try:
                os.kill(old_redis, signal.SIGCONT)
            except (ProcessLookupError, UnboundLocalError):
                pass
        _down_leaves_nothing(d, seen | _all_pids(d))
