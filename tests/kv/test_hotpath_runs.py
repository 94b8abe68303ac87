"""The front end's runs (frontend/connection.py): consecutive plain GETs a replica answers itself, and
consecutive plain GETs or SETs joining an open batch, are taken in tight inner loops. Whatever the
read boundaries, a connection gets the answers it gets one command per read, in order; a proxy's
runs leave as the frame its commands make; a SET batch's all-OK replies are found in one step and a
batch with an error among them is still settled reply by reply. No sockets: fake transports."""
from __future__ import annotations

import asyncio
import random

import hiredis
import pytest

from mlsyskit.tools.kv.client.rawrelay import SIMPLE, RawBatch, RelayConnection
from mlsyskit.tools.kv.controlets.base import GET, PUT
from mlsyskit.tools.kv.datalets.memory import MemoryDatalet
from mlsyskit.tools.kv.frontend.connection import ClientConnection
from mlsyskit.tools.kv.frontend.expiry import ActiveExpiry
from mlsyskit.tools.kv.node.requests import RelayBatch
from mlsyskit.tools.kv.node.runtime import Node
from mlsyskit.tools.kv.redis.resp import Limits
from mlsyskit.tools.kv.shardmap import ShardMap


class Transport:
    def __init__(self) -> None:
        self.data = bytearray()

    def write(self, data: bytes) -> None:
        self.data += data

    def get_write_buffer_size(self) -> int:
        return 0

    def get_extra_info(self, name: str) -> None:
        return None

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...

    def close(self) -> None: ...


def one_shard(controlet: str, replicas: int) -> ShardMap:
    nodes = {f"s0r{i}": {"host": "127.0.0.1", "port": 7000 + i} for i in range(replicas)}  # never dialled
    return ShardMap.from_dict({"controlet": controlet, "datalet": "memory", "epoch": 1, "nodes": nodes,
                               "shards": [list(nodes)]})


def command(*parts: bytes) -> bytes:
    return hiredis.pack_command(parts)


def script(rng: random.Random) -> list[bytes]:
    """Pipelined commands that start and end runs: hits, misses, writes, a record, an oversized key,
    a non-GET, a multi-key read and an inline-free mix of them."""
    keys = [b"k%d" % i for i in range(6)]
    out = []
    for _ in range(120):
        r = rng.random()
        k = rng.choice(keys)
        if r < 0.45:
            out.append(command(b"GET", k))
        elif r < 0.7:
            out.append(command(b"SET", k, b"v%d" % rng.randrange(1000)))
        elif r < 0.76:
            out.append(command(b"SET", k, b"x", b"EX", b"100"))  # a record: answered from its header
        elif r < 0.82:
            out.append(command(b"GET", b"K" * 600))  # over the key limit below: an error, not a run's
        elif r < 0.85:
            out.append(command(b"PING"))
        elif r < 0.88:
            out.append(command(rng.choice((b"EXISTS", b"TTL", b"get")), k))  # two parts, not a plain GET
        elif r < 0.94:
            out.append(command(b"MGET", k, rng.choice(keys)))
        else:
            out.append(command(b"GET", b"absent"))
    return out


async def answers(chunks: list[bytes], lease_until: float | None = None) -> bytes:
    node = Node(one_shard("ms-sc", 1), "s0r0", MemoryDatalet(), limits=Limits(max_key_bytes=512))
    await node.open()
    if lease_until is not None:  # a lease the node holds (or has lost): the fast paths check it per op
        node.lease_until = lease_until
        node._fast_ready = None
        node._refresh_fast_paths()
    conn = ClientConnection(node, ActiveExpiry(node, unix_ms=lambda: 1_000))
    transport = Transport()
    conn.connection_made(transport)
    for c in chunks:
        conn.data_received(c)
    return bytes(transport.data)


@pytest.mark.parametrize("seed", range(4))
def test_runs_answer_as_one_command_per_read_at_any_read_boundary(seed) -> None:
    rng = random.Random(seed)
    cmds = script(rng)
    stream = b"".join(cmds)
    one_by_one = asyncio.run(answers(cmds))
    cuts = sorted(rng.sample(range(1, len(stream)), 25))
    chunks = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
    assert asyncio.run(answers([stream])) == one_by_one
    assert asyncio.run(answers(chunks)) == one_by_one
    reader = hiredis.Reader()
    reader.feed(one_by_one)
    replies = [reader.gets() for _ in cmds]
    assert reader.gets() is False  # one answer per command, no more
    for c, reply in zip(cmds, replies, strict=True):
        if c.startswith(b"*2\r\n$3\r\nGET\r\n$600"):
            assert isinstance(reply, hiredis.ReplyError) and "too long" in str(reply)
    assert any(r not in (None, b"OK", b"PONG") and type(r) is bytes for r in replies)  # runs served hits


def test_a_lapsed_lease_refuses_every_get_of_a_run() -> None:
    gets = [command(b"GET", b"k%d" % i) for i in range(20)]
    held = asyncio.run(answers([b"".join(gets)], lease_until=float("inf")))
    assert held == b"$-1\r\n" * 20
    lapsed = asyncio.run(answers([b"".join(gets)], lease_until=float("-inf")))
    assert lapsed.count(b"-TRYAGAIN fenced") == 20 and lapsed.count(b"\r\n") == 20


async def proxy_run(stream: bytes, replies: list[bytes]) -> tuple[list[bytes], bytes]:
    """A proxy (a 1x1 shard behind a fake link) fed `stream` in one read, then replies[i] on the link
    for the i-th frame it sends: (the frames, what its client got)."""
    proxy = Node(one_shard("ms-sc", 1), None, None)
    sent = Transport()
    link_conn = RelayConnection()
    link_conn.connection_made(sent)
    proxy.link("s0r0").conn = link_conn
    conn = ClientConnection(proxy, ActiveExpiry(proxy))
    client = Transport()
    conn.connection_made(client)
    conn.data_received(stream)
    frames = []
    for reply in replies:
        link_conn.flush()
        frames.append(bytes(sent.data))
        sent.data.clear()
        link_conn.data_received(reply)
        await asyncio.sleep(0)  # the client's flush runs at the end of the loop turn
    return frames, bytes(client.data)


def test_a_proxy_run_leaves_as_its_commands_and_comes_back_raw_or_settled() -> None:
    sets = [command(b"SET", b"k%d" % i, b"v%d" % i) for i in range(10)]
    gets = [command(b"GET", b"k%d" % i) for i in range(10)]
    oks, values = b"+OK\r\n" * 10, b"$2\r\nvv\r\n" * 10
    frames, got = asyncio.run(proxy_run(b"".join(sets + gets), [oks, values]))
    # two batches, one frame each; the reads leave once the writes before them are answered (session order)
    assert frames == [b"".join(sets), b"".join(gets)]
    assert got == oks + values
    # an error among a SET batch's replies: that batch is parsed and its replies settled one by one
    replies = b"+OK\r\n" * 4 + b"-ERR datalet error: full\r\n" + b"+OK\r\n" * 5
    frames, got = asyncio.run(proxy_run(b"".join(sets), [replies]))
    assert frames == [b"".join(sets)] and got == replies


def test_all_ok_replies_of_a_set_batch_are_found_in_one_step_and_an_odd_one_is_not() -> None:
    async def body(data: bytes, n: int) -> tuple[list, list]:
        raw, parsed = [], []
        conn = RelayConnection()
        conn.send = lambda frame: None
        assert conn.call_raw(b"", RawBatch(n, SIMPLE, raw.append, parsed.append))
        conn.data_received(data)
        return raw, parsed

    assert asyncio.run(body(b"+OK\r\n" * 7, 7)) == ([b"+OK\r\n" * 7], [])
    raw, parsed = asyncio.run(body(b"+OK\r\n" * 3 + b":42\r\n" + b"+OK\r\n" * 3, 7))  # as long, not +OK
    assert raw == [] and parsed[0] == [b"OK"] * 3 + [42] + [b"OK"] * 3


def test_a_relay_batch_frame_is_its_commands_packed_one_by_one() -> None:
    """The proxy's frame of a batch (one join when keys, or keys and values, are of one length) is
    exactly what packing each command alone gives, for equal and mixed lengths."""
    rng = random.Random(5)
    for _ in range(200):
        n = rng.randint(1, 20)
        width = rng.choice([None, rng.randint(0, 40)])  # None: every key its own length
        keys = [rng.randbytes(width if width is not None else rng.randint(0, 40)) for _ in range(n)]
        vwidth = rng.choice([None, rng.randint(0, 64)])
        vals = [rng.randbytes(vwidth if vwidth is not None else rng.randint(0, 64)) for _ in range(n)]
        gets, sets = RelayBatch(GET, None), RelayBatch(PUT, None)
        gets.keys, sets.keys, sets.values = keys, keys, vals
        assert gets.frame() == b"".join(hiredis.pack_command((b"GET", k)) for k in keys)
        assert sets.frame() == b"".join(hiredis.pack_command((b"SET", k, v)) for k, v in zip(keys, vals, strict=True))
