"""Issue 22 item 4 as pure objects: Redis Cluster's slot math, the redirect and retry decisions, the
CLUSTER replies, and the rider's hold-and-retry on a virtual clock (no sockets, no servers)."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

import hiredis
import pytest

from mlsyskit.core.clock import VirtualClock
from mlsyskit.core.config import ConfigError
from mlsyskit.tools.kv.client.mapfollow import retriable
from mlsyskit.tools.kv.client.pipeline import ConnectionLost
from mlsyskit.tools.kv.client.smart import KVError, certainly_not_applied
from mlsyskit.tools.kv.controlets import controlet_class
from mlsyskit.tools.kv.controlets.base import DEL, GET, PUT, RMW
from mlsyskit.tools.kv.datalets.memory import MemoryDatalet
from mlsyskit.tools.kv.frontend.cluster import hex_id, nodes_reply, shards_reply, slots_reply
from mlsyskit.tools.kv.frontend.commands import cmd_hello
from mlsyskit.tools.kv.node.requests import Request, idempotent, moved, shard_order, worth_retrying
from mlsyskit.tools.kv.node.ridethrough import Rider
from mlsyskit.tools.kv.node.runtime import Node
from mlsyskit.tools.kv.shardmap import SLOTS, ShardMap, even_slots, key_slot, layout


def test_key_slot_is_redis_clusters_crc16_with_hash_tags() -> None:
    assert key_slot(b"123456789") == 0x31C3  # the CRC16-XMODEM check value
    assert key_slot(b"foo") == 12182 and key_slot(b"bar") == 5061  # CLUSTER KEYSLOT on Redis 7
    assert key_slot(b"{user1000}.following") == key_slot(b"{user1000}.followers") == key_slot(b"user1000")
    assert key_slot(b"foo{}{bar}") == key_slot(b"foo{}{bar}") != key_slot(b"bar")  # empty tag: whole key
    assert key_slot(b"foo{{bar}}zap") == key_slot(b"{bar")  # from the first { to the next }
    assert key_slot(b"foo{bar}{zap}") == key_slot(b"bar")
    assert all(0 <= key_slot(b"k%d" % i) < SLOTS for i in range(1000))


def test_even_slots_match_redis_cli_create_and_every_slot_has_one_owner() -> None:
    assert even_slots(3) == (((0, 5460),), ((5461, 10922),), ((10923, 16383),))
    assert even_slots(1) == (((0, 16383),),)
    smap = layout("ms-sc", "memory", 3, 2, "127.0.0.1", list(range(7001, 7007)))
    assert [smap.shard_of_slot(s) for s in (0, 5460, 5461, 10922, 10923, 16383)] == [0, 0, 1, 1, 2, 2]
    assert smap.shard_for(b"foo") == smap.shard_of_slot(12182) == 2


def test_custom_slot_ranges_round_trip_and_bad_ones_are_refused() -> None:
    smap = layout("ms-sc", "memory", 2, 1, "127.0.0.1", [7001, 7002])
    ranges = (((0, 99), (200, 16383)), ((100, 199),))
    custom = ShardMap(2, smap.controlet, smap.datalet, smap.shards, smap.nodes, slots=ranges)
    again = ShardMap.from_json(custom.to_json())
    assert again.slots == ranges and again.shard_of_slot(150) == 1 and again.shard_of_slot(250) == 0
    with pytest.raises(ConfigError, match="belongs to no shard"):
        ShardMap(2, smap.controlet, smap.datalet, smap.shards, smap.nodes, slots=(((0, 99),), ((100, 199),)))
    with pytest.raises(ConfigError, match="overlaps"):
        ShardMap(2, smap.controlet, smap.datalet, smap.shards, smap.nodes,
                 slots=(((0, 16383),), ((100, 199),)))
    with pytest.raises(ConfigError, match="within"):
        ShardMap(2, smap.controlet, smap.datalet, smap.shards, smap.nodes, slots=(((0, 16384),), ((5, 5),)))


def test_moved_names_the_slot_and_the_write_point_of_its_shard() -> None:
    smap = layout("ms-sc", "memory", 2, 3, "127.0.0.1", list(range(7001, 7007)))
    chain = controlet_class("ms-sc")
    assert shard_order(chain, ("a", "b", "c")) == ["a", "b", "c"]  # head first
    assert moved(smap, chain, b"foo") == b"-MOVED 12182 127.0.0.1:7004\r\n"  # shard 1's head s1r0
    assert moved(smap, chain, b"bar") == b"-MOVED 5061 127.0.0.1:7001\r\n"
    assert moved(smap, chain, b"{bar}x") == b"-MOVED 5061 127.0.0.1:7001\r\n"


def _req(op: str, rmw: list[bytes] | None = None) -> Request:
    req = Request(op, b"k", b"v" if op is PUT else None, None)
    req.rmw = rmw
    return req


def test_what_may_be_sent_again() -> None:
    get, put, dele, incr = _req(GET), _req(PUT), _req(DEL), _req(RMW, [b"INCR", b"k"])
    assert idempotent(get) and idempotent(put) and not idempotent(dele) and not idempotent(incr)
    never_ran = (b"-CLUSTERDOWN the shard's node is unreachable, not applied: x\r\n",
                 b"-TRYAGAIN fenced: s0r0 is not in the shard map\r\n", b"-TRYAGAIN not serving yet: x\r\n")
    unknown = b"-TRYAGAIN forward failed: connection lost\r\n"
    for req in (get, put, dele, incr):
        assert all(worth_retrying(req, p) for p in never_ran)  # refused before it ran: anything goes again
        assert not worth_retrying(req, b"+OK\r\n") and not worth_retrying(req, b"-ERR wrong type\r\n")
    assert worth_retrying(get, unknown) and worth_retrying(put, unknown)  # idempotent: again is harmless
    assert not worth_retrying(incr, unknown) and not worth_retrying(dele, unknown)  # may have happened
    moved_away = b"-MOVED 5061 127.0.0.1:7001\r\n"  # a node out of the map: refused, never ran
    assert worth_retrying(incr, moved_away) and certainly_not_applied(moved_away[1:-2].decode())
    assert retriable(KVError(moved_away[1:-2].decode()), idempotent=False)  # the smart client's view too


def test_cluster_replies_name_the_write_point_or_its_successor_when_it_refuses() -> None:
    smap = layout("ms-sc", "memory", 2, 3, "127.0.0.1", list(range(7001, 7007)))
    chain = controlet_class("ms-sc")
    table = slots_reply(smap, chain)
    assert table[0][:3] == [0, 8191, ["127.0.0.1", 7001, hex_id("s0r0")]]
    assert [e[1] for e in table[1][2:]] == [7004, 7005, 7006]
    down = slots_reply(smap, chain, frozenset({"s0r0"}))
    assert [e[1] for e in down[0][2:]] == [7002, 7003, 7001] and down[1] == table[1]
    shards = shards_reply(smap, chain, frozenset({"s0r0"}))
    assert shards[0]["slots"] == [0, 8191]
    assert [(n["port"], n["role"], n["health"]) for n in shards[0]["nodes"]] == [
        (7002, "master", "online"), (7003, "replica", "online"), (7001, "replica", "failed")]
    lines = nodes_reply(smap, chain, "s1r1").decode().splitlines()
    assert len(lines) == 6 and lines[0].endswith("connected 0-8191") and "myself,slave" in lines[4]
    assert len(hex_id("s0r0")) == 40


class FakeLink:
    """A link to a dead node: calls fail on the next loop turn, never sent or lost after the send."""

    def __init__(self, message: str) -> None:
        self.message = message

    def call_back(self, frame: bytes, fn) -> None:
        fut = asyncio.get_running_loop().create_future()
        fut.set_exception(ConnectionLost(self.message))
        fut.get_loop().call_soon(fn, fut)


class PausedLink:
    """A link to a stopped node: calls wait until `fail_all` (it came back fenced)."""

    def __init__(self) -> None:
        self.waiting: list = []

    def call_back(self, frame: bytes, fn) -> None:
        self.waiting.append(fn)

    def fail_all(self) -> None:
        for fn in self.waiting:
            fut = asyncio.get_running_loop().create_future()
            fut.set_exception(hiredis.ReplyError("TRYAGAIN fenced: s0r0 is not in the shard map"))
            fn(fut)


class NewHead:
    """A link to the new write point: applies and answers at once."""

    def __init__(self, node: FakeNode) -> None:
        self.node = node

    def call_back(self, frame: bytes, fn) -> None:
        self.node.applied.append(frame.split(b"\r\n")[-2])  # SET k value: the value
        fut = asyncio.get_running_loop().create_future()
        fut.set_result(b"OK")
        fn(fut)


class FakeNode:
    """The rider's node: before `failover_at` (virtual s) every request is forwarded to the dead
    write point; after it this node is the write point and applies what it gets, in order."""

    def __init__(self, message: str, failover_at: float = 4.0) -> None:
        self.map = SimpleNamespace(epoch=1)
        self.clock = VirtualClock()
        self.agent = object()  # follows a coordinator: the rider rides through
        self.failover_at = failover_at
        self.stats = {"forwarded": 0}
        self.applied: list[bytes] = []
        self.message = message
        self.rider = Rider(self)
        self.tasks: set[asyncio.Task] = set()

    def link(self, node_id: str) -> FakeLink:
        return FakeLink(self.message)

    def submit(self, req: Request) -> None:
        if self.clock.now() < self.failover_at:
            self.rider.forward(req, "dead")
            return
        self.applied.append(req.value or req.key)
        req.complete(b"+OK\r\n" if req.op is PUT else b":1\r\n")

    def spawn(self, work) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)


class Conn:
    def __init__(self) -> None:
        self.answers: list[bytes] = []

    def slot_done(self, req: Request) -> None:
        self.answers.append(req.payload)


def _run(node: FakeNode, requests: list[Request]) -> None:
    async def body() -> None:
        for req in requests:
            node.submit(req)
        while any(r.payload is None for r in requests):
            await asyncio.sleep(0)
    asyncio.run(asyncio.wait_for(body(), 10))


def test_held_writes_ride_through_in_their_connections_order() -> None:
    node, conn = FakeNode("connection lost: closed by peer"), Conn()  # sent, then the head died
    writes = [Request(PUT, b"k", b"v%d" % i, conn) for i in range(5)]
    _run(node, writes)
    assert conn.answers == [b"+OK\r\n"] * 5 and node.applied == [b"v%d" % i for i in range(5)]
    assert node.rider.stats["rode_through"] == 5 and node.rider.stats["gave_up"] == 0
    assert node.clock.now() >= node.failover_at and not node.rider.held


def test_a_non_idempotent_write_of_unknown_outcome_is_not_sent_again() -> None:
    node, conn = FakeNode("connection lost: closed by peer"), Conn()
    incr = Request(RMW, b"n", None, conn)
    incr.rmw = [b"INCR", b"n"]
    _run(node, [incr])
    assert conn.answers[0].startswith(b"-TRYAGAIN forward failed") and node.applied == []


def test_a_never_sent_incr_rides_through_and_an_endless_outage_ends_in_its_error() -> None:
    node, conn = FakeNode("cannot reach 127.0.0.1:1: refused"), Conn()
    incr = Request(RMW, b"n", None, conn)
    incr.rmw = [b"INCR", b"n"]
    _run(node, [incr])
    assert conn.answers == [b":1\r\n"] and node.applied == [b"n"]  # never ran before: safe to send
    down, conn = FakeNode("cannot reach 127.0.0.1:1: refused", failover_at=1e9), Conn()
    _run(down, [Request(GET, b"k", None, conn)])
    assert conn.answers[0].startswith(b"-CLUSTERDOWN") and down.rider.stats["gave_up"] == 1
    assert 10.0 <= down.clock.now() <= 11.0  # RIDE_THROUGH_S, then the error it always was


def test_a_request_overtaken_under_a_newer_map_keeps_its_error() -> None:
    """A stopped head answers fenced only after the new map; meanwhile a later SET of the same
    connection went out to the new head and was applied: resending the first would undo it."""
    async def main() -> None:
        node, conn, paused = FakeNode("unused"), Conn(), PausedLink()
        node.link = lambda n: paused
        first, later = Request(PUT, b"k", b"v1", conn), Request(PUT, b"k", b"v2", conn)
        node.rider.forward(first, "old")  # to the stopped head, under epoch 1
        node.link = lambda n: NewHead(node)
        node.map.epoch = 2
        node.rider.forward(later, "new")  # the new map's head: applied
        paused.fail_all()  # the old head comes back and refuses
        await asyncio.sleep(0)
        assert later.payload == b"+OK\r\n" and first.payload.startswith(b"-TRYAGAIN fenced")
        assert node.applied == [b"v2"] and node.rider.stats["held"] == 0

    asyncio.run(asyncio.wait_for(main(), 10))


@pytest.mark.parametrize("redirect, mode", [(True, b"cluster"), (False, b"standalone")])
def test_hello_says_cluster_mode_only_where_the_node_redirects(redirect: bool, mode: bytes) -> None:
    sent: list[bytes] = []
    conn = SimpleNamespace(node=SimpleNamespace(redirect=redirect, requirepass=None), authed=True,
                           id=1, protocol=2, name=None, reply=sent.append)
    cmd_hello(conn, [b"HELLO", b"3"])
    reader = hiredis.Reader()
    reader.feed(sent[0])
    reply = reader.gets()
    fields = dict(zip(reply[::2], reply[1::2], strict=True)) if isinstance(reply, list) else reply
    assert fields[b"mode"] == mode and fields[b"server"] == b"bespokv" and conn.protocol == 3


def test_a_write_point_queues_a_connections_request_behind_its_held_ones() -> None:
    """This node became the write point while an earlier SET of the connection is held (its forward
    to the old head failed): the later SET must not be applied locally first, or the held one's
    retry would land after it (SET k 1, SET k 2 ending as k=1). Another connection is unaffected."""
    async def main() -> None:
        smap = layout("ms-sc", "memory", 1, 1, "127.0.0.1", [7001])
        node = Node(smap, "s0r0", MemoryDatalet(), clock=VirtualClock())
        node.rider.window_s = 10.0
        conn, other = Conn(), Conn()
        first, later = Request(PUT, b"k", b"1", conn), Request(PUT, b"k", b"2", conn)
        elsewhere = Request(PUT, b"j", b"x", other)
        node.rider.hold(first)  # its forward to the old head failed retriably: held, retried soon
        assert node.fast_put is None  # the front end's local fast path is off while anything is held
        node.submit(later)
        node.submit(elsewhere)
        assert elsewhere.payload == b"+OK\r\n" and later.payload is None  # queued behind `first`
        while later.payload is None:
            await asyncio.sleep(0)
        assert conn.answers == [b"+OK\r\n", b"+OK\r\n"] and node.datalet.get(b"k") == b"2"
        assert not node.rider.held and node.fast_put is not None

    asyncio.run(asyncio.wait_for(main(), 10))
