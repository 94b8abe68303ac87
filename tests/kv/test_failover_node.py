"""Nodes under a new shard map, in one process: failover keeps every acknowledged write and answers
each waiting write once; fencing by epoch, deposed nodes and lapsed leases refuse clients.

The coordinator's planner (coord/failover.py) makes the maps; here they are applied to real nodes
on loopback sockets by hand (Node.reconfigure), as a node's ControlAgent does when it sees them.
"""
from __future__ import annotations

import asyncio
from dataclasses import replace

import hiredis
import pytest

from mlsyskit.tools.kv.client.mapfollow import FollowingClient
from mlsyskit.tools.kv.client.pipeline import RespConnection
from mlsyskit.tools.kv.client.smart import KVError, SmartClient
from mlsyskit.tools.kv.controlets.base import ControletOptions
from mlsyskit.tools.kv.coord.failover import plan_failover, plan_join
from mlsyskit.tools.kv.frontend.server import start_node
from mlsyskit.tools.kv.node.requests import Request
from mlsyskit.tools.kv.ops.cluster import LocalCluster
from tests.kv.conftest import datalet_factory, make_map, peer_connection


def run(coro, timeout: float = 60):
    return asyncio.run(asyncio.wait_for(coro, timeout))


async def wait_until(cond, timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


async def apply_map(cluster: LocalCluster, new_map, dead: set[str]) -> None:
    for nid, node in cluster.nodes.items():
        if nid not in dead:
            node.reconfigure(new_map)
    cluster.map = new_map
    # a promoted origin polls the survivors first (a round trip); then every member serves
    await wait_until(lambda: all(cluster.nodes[n].ready for n in new_map.nodes if n not in dead))


@pytest.mark.slow
@pytest.mark.parametrize("failed", ["s0r0", "s0r1", "s0r2"])
def test_ms_sc_failover_keeps_every_acked_write(failed: str, tmp_path) -> None:
    """Head, middle or tail dies; the chain without it serves every write acknowledged before,
    accepts new ones, and no request is answered twice."""
    async def body() -> None:
        smap = make_map("ms-sc", shards=1, replicas=3)
        async with LocalCluster(smap, datalet_factory("memory", tmp_path)) as cluster:
            client = SmartClient(smap)
            for i in range(100):
                await client.put(b"k%d" % i, b"v%d" % i)
            await client.close()
            await cluster.kill(failed)
            new = plan_failover(smap, [failed])
            await apply_map(cluster, new, {failed})
            after = SmartClient(new)
            for i in range(100, 150):
                await after.put(b"k%d" % i, b"v%d" % i)
            assert [await after.get(b"k%d" % i) for i in range(150)] == [b"v%d" % i for i in range(150)]
            await after.close()
            tail = cluster.nodes[new.shards[0][-1]]
            assert tail.controlet.ready and tail.map.epoch == smap.epoch + 1
        assert Request.duplicate_completions == 0

    run(body())


@pytest.mark.slow
def test_ms_sc_writes_waiting_when_the_middle_dies_are_answered_once_by_the_new_tail(tmp_path) -> None:
    """The middle dies holding writes the tail never got: the head keeps them waiting, the tail
    catches up from the head under the new map and acknowledges them; none is lost or doubled."""
    async def body() -> None:
        smap = make_map("ms-sc", shards=1, replicas=3)
        options = ControletOptions(write_timeout=10.0)
        async with LocalCluster(smap, datalet_factory("memory", tmp_path), options=options) as cluster:
            head, middle = cluster.nodes["s0r0"], cluster.nodes["s0r1"]
            await middle.stop()  # the middle is gone; the head's writes wait for acks that cannot come
            conn = await RespConnection.connect(smap.nodes["s0r0"].host, smap.nodes["s0r0"].port)
            pending = [conn.call(b"SET", b"w%d" % i, b"%d" % i) for i in range(20)]
            await wait_until(lambda: len(head.controlet.in_flight) == 20)
            new = plan_failover(smap, ["s0r1"])
            await apply_map(cluster, new, {"s0r1"})
            assert await asyncio.gather(*pending) == [b"OK"] * 20
            tail = cluster.nodes["s0r2"]
            assert [tail.datalet.get(b"w%d" % i) for i in range(20)] == [b"%d" % i for i in range(20)]
            assert tail.controlet.syncs >= 1  # it had missed them: caught up from the head
            await conn.close()
        assert Request.duplicate_completions == 0

    run(body())


@pytest.mark.slow
def test_ms_ec_promotes_a_replica_and_the_others_follow_it(tmp_path) -> None:
    async def body() -> None:
        smap = make_map("ms-ec", shards=1, replicas=3)
        async with LocalCluster(smap, datalet_factory("memory", tmp_path)) as cluster:
            client = SmartClient(smap)
            for i in range(50):
                await client.put(b"k%d" % i, b"v%d" % i)
            await client.close()
            await wait_until(lambda: all(cluster.nodes[n].controlet.applied == 50 for n in ("s0r1", "s0r2")))
            await cluster.kill("s0r0")
            new = plan_failover(smap, ["s0r0"], {"s0r1": 50, "s0r2": 50})
            await apply_map(cluster, new, {"s0r0"})
            after = SmartClient(new)
            await after.put(b"late", b"x")
            await wait_until(lambda: cluster.nodes["s0r2"].datalet.get(b"late") == b"x")
            assert cluster.nodes["s0r1"].info()["role"] == "master"
            assert cluster.nodes["s0r2"].datalet.get(b"k49") == b"v49"
            await after.close()

    run(body())


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["aa-sc", "aa-ec"])
def test_active_active_replica_leaves_and_the_rest_serve(mode: str, tmp_path) -> None:
    async def body() -> None:
        smap = make_map(mode, shards=1, replicas=3)
        async with LocalCluster(smap, datalet_factory("memory", tmp_path)) as cluster:
            client = SmartClient(smap, seed=3)
            for i in range(30):
                await client.put(b"k%d" % i, b"v%d" % i)
            await client.close()
            await cluster.kill("s0r0")  # aa-sc: the sequencer
            new = plan_failover(smap, ["s0r0"])
            await apply_map(cluster, new, {"s0r0"})
            after = SmartClient(new, seed=4)
            for i in range(30, 40):
                await after.put(b"k%d" % i, b"v%d" % i)
            await wait_until(lambda: all(cluster.nodes[n].datalet.size() == 40 for n in ("s0r1", "s0r2")))
            assert [await after.get(b"k%d" % i) for i in range(40)] == [b"v%d" % i for i in range(40)]
            await after.close()

    run(body())


@pytest.mark.slow
def test_a_replacement_joins_at_the_tail_and_catches_up(tmp_path) -> None:
    async def body() -> None:
        smap = make_map("ms-sc", shards=1, replicas=2)
        async with LocalCluster(smap, datalet_factory("memory", tmp_path)) as cluster:
            client = SmartClient(smap)
            for i in range(300):
                await client.put(b"k%d" % i, b"v%d" % i)
            await client.close()
            await cluster.kill("s0r1")
            shrunk = plan_failover(smap, ["s0r1"])
            await apply_map(cluster, shrunk, {"s0r1"})
            # The same id comes back empty, joins (as nodeproc._serve_managed does), then catches up.
            grown = plan_join(shrunk, 0, smap.nodes["s0r1"])
            cluster.map = grown
            fresh = cluster.nodes["s0r1"] = cluster._make("s0r1")
            await start_node(fresh, catch_up=True)
            await apply_map(cluster, grown, {"s0r1"})
            await wait_until(lambda: fresh.ready and fresh.datalet.size() == 300)
            after = SmartClient(grown)
            await after.put(b"new", b"1")
            assert await after.get(b"k299") == b"v299" and await after.get(b"new") == b"1"
            assert fresh.info()["role"] == "tail"
            await after.close()

    run(body())


@pytest.mark.slow
def test_newer_epoch_messages_are_held_until_the_map_arrives_and_older_ones_dropped(tmp_path) -> None:
    class FakeAgent:
        refreshes = 0

        def refresh_soon(self) -> None:
            self.refreshes += 1

        async def stop(self) -> None:
            pass

    async def body() -> None:
        smap = make_map("ms-ec", shards=1, replicas=2)
        async with LocalCluster(smap, datalet_factory("memory", tmp_path)) as cluster:
            replica = cluster.nodes["s0r1"]
            replica.agent = FakeAgent()
            conn = await peer_connection(cluster, "s0r1", "s0r0")
            newer = smap.epoch + 1
            conn.send(hiredis.pack_command((b"BKV.MSG", newer, b"s0r0", b"REPL", 1, b"P", b"k", b"new")))
            conn.send(hiredis.pack_command((b"BKV.MSG", smap.epoch - 1, b"s0r0", b"REPL", 1, b"P", b"k", b"old")))
            assert await conn.call(b"PING") == b"PONG"
            assert replica.datalet.get(b"k") is None and len(replica.held) == 1
            assert replica.agent.refreshes == 1 and replica.stats["fenced"] == 1
            replica.reconfigure(replace(smap, epoch=newer))  # same replicas, next epoch
            assert replica.datalet.get(b"k") == b"new" and not replica.held
            await conn.close()

    run(body())


@pytest.mark.slow
def test_a_deposed_node_and_a_node_without_lease_refuse_clients(tmp_path) -> None:
    async def body() -> None:
        smap = make_map("ms-sc", shards=1, replicas=3)
        async with LocalCluster(smap, datalet_factory("memory", tmp_path)) as cluster:
            client = SmartClient(smap)
            await client.put(b"k", b"v1")
            tail = cluster.nodes["s0r2"]
            tail.renew_lease(tail.clock.now() + 30)
            assert await client.get(b"k") == b"v1"  # leased: served (fast path, lease checked)
            tail.renew_lease(tail.clock.now() - 1)  # lapsed (a pause, a lost coordinator)
            with pytest.raises(KVError, match="fenced: s0r2 has no current lease"):
                await client.get(b"k")
            addr = smap.nodes["s0r2"]
            conn = await RespConnection.connect(addr.host, addr.port)
            tail.renew_lease(tail.clock.now() + 30)
            assert await conn.call(b"GET", b"k") == b"v1"
            tail.ticker.cancel()  # no timer runs (a tick would turn the fast path off: a loaded run did)
            tail.lease_until = tail.clock.now() - 1  # lapses between two reads
            fenced_before = tail.stats["fenced"]
            for command in (b"GET", b"get", b"STRLEN"):  # the inlined fast path and the handlers' local reads
                with pytest.raises(hiredis.ReplyError, match="TRYAGAIN fenced: s0r2 has no current lease"):
                    await asyncio.wait_for(conn.call(command, b"k"), 5)
            assert tail.stats["fenced"] == fenced_before + 3
            tail.ticker = asyncio.get_running_loop().create_task(tail._tick_forever())
            assert await conn.call(b"PING") == b"PONG" and not conn.closed  # refused, not dropped
            tail.lease_until = tail.clock.now() + 30
            assert await conn.call(b"GET", b"k") == b"v1"
            await conn.close()

            new = plan_failover(smap, ["s0r2"])
            await apply_map(cluster, new, set())  # the old tail hears it is out (deposed)
            tail.lease_until = tail.clock.now() + 30
            with pytest.raises(KVError, match="fenced: s0r2 is not in the shard map"):
                await client.get(b"k")
            assert tail.info()["role"] == "deposed" and tail.info()["catching_up"] == 1
            await client.close()

            async def newest():
                return new
            following = FollowingClient(smap, newest, ride_through_s=0)
            with pytest.raises(KVError):
                await following.get(b"k")  # refused by the deposed tail, then the map is fetched
            assert following.map.epoch == new.epoch and await following.get(b"k") == b"v1"
            await following.close()
            riding = FollowingClient(smap, newest)  # rides through: refused, the new map, the new tail
            assert await riding.get(b"k") == b"v1" and riding.map.epoch == new.epoch
            following = riding
            await following.close()

    run(body())


@pytest.mark.slow
def test_a_promoted_ms_ec_master_first_copies_from_a_survivor_that_is_ahead(tmp_path) -> None:
    """The coordinator promotes s0r1 on stale progress counts while s0r2 had received one more of
    the old master's writes: the new master polls the survivors and copies from s0r2 first, so
    that acknowledged write is not lost."""
    async def body() -> None:
        smap = make_map("ms-ec", shards=1, replicas=3)
        async with LocalCluster(smap, datalet_factory("memory", tmp_path)) as cluster:
            client = SmartClient(smap)
            for i in range(20):
                await client.put(b"k%d" % i, b"v%d" % i)
            await client.close()
            await wait_until(lambda: all(cluster.nodes[n].controlet.applied == 20 for n in ("s0r1", "s0r2")))
            await cluster.kill("s0r0")
            # the old master's 21st write reached s0r2 only (as if its link to s0r1 had been slower)
            conn = await peer_connection(cluster, "s0r2", "s0r0")
            conn.send(hiredis.pack_command((b"BKV.MSG", smap.epoch, b"s0r0", b"REPL", 21, b"P", b"late", b"x")))
            assert await conn.call(b"PING") == b"PONG"
            await conn.close()
            assert cluster.nodes["s0r2"].controlet.applied == 21
            new = plan_failover(smap, ["s0r0"], {"s0r1": 20, "s0r2": 20})  # stale counts: s0r1 wins the tie
            assert new.shards[0][0] == "s0r1"
            await apply_map(cluster, new, {"s0r0"})
            master = cluster.nodes["s0r1"]
            await wait_until(lambda: master.ready and master.controlet.applied == 21)
            assert master.datalet.get(b"late") == b"x" and master.controlet.syncs >= 1
            after = SmartClient(new)
            await after.put(b"next", b"y")
            await wait_until(lambda: cluster.nodes["s0r2"].datalet.get(b"next") == b"y")
            await after.close()

    run(body())


def test_the_control_agent_outlives_an_unexpected_error_and_still_takes_its_lease() -> None:
    """Any exception out of one round is logged and retried, never the end of the agent: a dead
    agent leaves its node without a lease (refusing every client) and never rejoining, and the
    task's exception would surface only when the task is collected, which it never is."""
    from types import SimpleNamespace

    from mlsyskit.tools.kv.coord.aclient import CoordUnavailable
    from mlsyskit.tools.kv.coord.spec import parse_coordinator
    from mlsyskit.tools.kv.node.agent import ControlAgent
    from mlsyskit.tools.kv.shardmap import NodeAddr

    leases: list[float] = []
    node = SimpleNamespace(node_id="s0r0", map=SimpleNamespace(epoch=1), deposed=False, controlet=None,
                           applied=lambda: 0, renew_lease=leases.append, _refresh_fast_paths=lambda: None)
    failures = [RuntimeError("a bug in a round"), CoordUnavailable("coordinator restarting")]

    class Backend:
        registered = 0

        async def register(self, node_id: str, host: str, port: int) -> None:
            if failures:
                raise failures.pop(0)
            self.registered += 1

        async def heartbeat(self, node_id: str, applied: int) -> tuple[bool, int]:
            return True, 1

    backend = Backend()
    agent = ControlAgent(node, parse_coordinator("embedded://127.0.0.1:9", interval_s=0.01),
                         NodeAddr("s0r0", "127.0.0.1", 7001), 0, backend=backend)

    async def main() -> None:
        agent.start()
        try:
            await wait_until(lambda: leases, timeout=10)
        finally:
            agent.task.cancel()
    run(main())
    assert backend.registered == 1 and agent.stats["unexpected_errors"] == 1
    assert agent.stats["heartbeat_failures"] == 2


def test_a_node_whose_controlet_tick_fails_stops_instead_of_serving_without_timeouts(tmp_path) -> None:
    """The tick fires every timeout a controlet has (waiting writes, retries, anti-entropy). A tick
    that raised used to end the ticker task silently, leaving a node that heartbeats (so it is never
    failed over) while no waiting write is ever answered or failed. Now the node calls on_fatal
    (a node process then fail-stops, to be failed over and replaced)."""
    from mlsyskit.tools.kv.controlets import controlet_class
    from mlsyskit.tools.kv.node.runtime import Node
    from mlsyskit.tools.kv.ops.cluster import node_datalet

    smap = make_map("ms-sc", shards=1)
    node = Node(smap, "s0r0", node_datalet("memory", "s0r0", tmp_path, None), tick_interval=0.01)
    fatal: list[str] = []
    node.on_fatal = fatal.append

    async def main() -> None:
        await node.open()
        assert isinstance(node.controlet, controlet_class("ms-sc"))

        def broken(now: float) -> list:
            raise KeyError("a bug in on_tick")
        node.controlet.on_tick = broken
        try:
            await wait_until(lambda: fatal, timeout=10)
            assert node.ticker.done() and node.ticker.exception() is None  # it ended by itself, reported
        finally:
            await node.stop()
    run(main())
    assert "tick failed: KeyError" in fatal[0] and "a bug in on_tick" in fatal[0]


def test_a_node_that_just_joined_heartbeats_at_once_for_its_lease_but_only_once() -> None:
    """A replacement serves only once a heartbeat under the new map grants it a lease; waiting a
    whole interval for it left a new ms-sc tail refusing reads with -TRYAGAIN for up to 0.5 s (the
    demo's `bespokv get` hit it). The round after a join follows at once; a node that keeps
    rejoining still waits its interval between every other round."""
    from types import SimpleNamespace

    from mlsyskit.tools.kv.coord.spec import parse_coordinator
    from mlsyskit.tools.kv.node.agent import ControlAgent
    from mlsyskit.tools.kv.shardmap import NodeAddr

    node = SimpleNamespace(node_id="s0r0", map=SimpleNamespace(epoch=1), deposed=False, controlet=None,
                           applied=lambda: 0, renew_lease=lambda t: None, _refresh_fast_paths=lambda: None)
    agent = ControlAgent(node, parse_coordinator("embedded://127.0.0.1:9", interval_s=60.0),
                         NodeAddr("s0r0", "127.0.0.1", 7001), 0, backend=SimpleNamespace())
    rounds: list[float] = []

    async def always_joined() -> bool:
        rounds.append(asyncio.get_running_loop().time())
        return True
    agent.step = always_joined

    async def main() -> None:
        agent.start()
        try:
            await wait_until(lambda: len(rounds) >= 2, timeout=10)  # not 60 s: at once
            for _ in range(20):  # let the loop reach its wait; a third round would need 60 s
                await asyncio.sleep(0)
            assert len(rounds) == 2
        finally:
            agent.task.cancel()
    run(main())
