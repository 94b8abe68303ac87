"""A proxy's batch replies relayed as the bytes they came in (client/rawrelay.py): every reply of a
link ends where hiredis says it ends, whatever the read boundaries, mixed with parsed replies."""
from __future__ import annotations

import asyncio
import random

import hiredis
import pytest

from mlsyskit.tools.kv.client.pipeline import ConnectionLost
from mlsyskit.tools.kv.client.rawrelay import BULK, SIMPLE, Incomplete, RawBatch, RelayConnection, reply_end

REPLIES = [b"$3\r\nabc\r\n", b"$-1\r\n", b"+OK\r\n", b"-ERR no\r\n", b":42\r\n", b"$0\r\n\r\n",
           b"*3\r\n$1\r\na\r\n*2\r\n:1\r\n$-1\r\n+x\r\n", b"*0\r\n", b"$6\r\na\r\nb\r\n\r\n"]


def test_reply_end_agrees_with_hiredis_on_every_prefix() -> None:
    for r in REPLIES:
        assert reply_end(r + b"junk", 0) == len(r)
        for cut in range(len(r)):
            with pytest.raises(Incomplete):
                reply_end(r[:cut], 0)
    with pytest.raises(hiredis.ProtocolError):
        reply_end(b"%1\r\n", 0)


class Sink:
    def __init__(self) -> None:
        self.raw: list[bytes] = []
        self.parsed: list[list] = []


def run_links(chunks: list[bytes], plan: list) -> tuple[Sink, list]:
    """Waiters per `plan` (("raw", n, expect) or "one"), then the replies fed in `chunks`."""
    async def body():
        conn = RelayConnection()
        conn.send = lambda frame: None  # no transport: only the reply side is under test
        sink, futs = Sink(), []
        for p in plan:
            if p == "one":
                futs.append(conn.call_frame(b""))
            else:
                _, n, expect = p
                assert conn.call_raw(b"", RawBatch(n, expect, sink.raw.append, sink.parsed.append))
        for c in chunks:
            conn.data_received(c)
        results = [f.exception() or f.result() if f.done() else None for f in futs]
        conn.connection_lost(None)
        return sink, results

    return asyncio.run(body())


@pytest.mark.parametrize("seed", range(6))
def test_batches_are_relayed_raw_and_single_replies_parsed_at_any_read_boundary(seed) -> None:
    rng = random.Random(seed)
    gets = [b"$%d\r\n%b\r\n" % (n, b"v" * n) for n in (1, 0, 70_000, 5)] + [b"$-1\r\n"]
    stream = b"".join(gets) + b"*2\r\n$1\r\na\r\n:7\r\n" + b"+OK\r\n+OK\r\n" + b"$2\r\nzz\r\n-TRYAGAIN x\r\n"
    plan = [("raw", 5, BULK), "one", ("raw", 2, SIMPLE), ("raw", 2, BULK)]
    cuts = sorted(rng.sample(range(1, len(stream)), 12))
    chunks = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
    sink, results = run_links(chunks, plan)
    assert sink.raw == [b"".join(gets), b"+OK\r\n+OK\r\n"]  # byte for byte what the node sent
    assert results == [[b"a", 7]]
    (parsed,) = sink.parsed  # a batch with an error reply: parsed, settled one by one
    assert parsed[0] == b"zz" and isinstance(parsed[1], hiredis.ReplyError) and "TRYAGAIN" in str(parsed[1])


def test_a_lost_connection_fails_the_missing_replies_of_a_raw_batch() -> None:
    sink, _ = run_links([b"$1\r\na\r\n$1\r"], [("raw", 3, BULK)])
    (parsed,) = sink.parsed
    assert parsed[0] == b"a" and all(isinstance(e, ConnectionLost) for e in parsed[1:])


def test_scan_mode_starts_only_when_hiredis_holds_no_part_of_a_reply() -> None:
    async def body():
        conn = RelayConnection()
        conn.send = lambda frame: None
        fut = conn.call_frame(b"")
        conn.data_received(b"$5\r\nab")  # hiredis holds part of a reply
        assert not conn.call_raw(b"", RawBatch(1, BULK, print, print))  # the caller uses a parsed batch
        conn.data_received(b"cde\r\n")
        assert fut.result() == b"abcde" and not conn.scanning
        relayed: list[bytes] = []
        assert conn.call_raw(b"", RawBatch(1, BULK, relayed.append, print))
        conn.data_received(b"$1\r\nx\r\n")
        assert relayed == [b"$1\r\nx\r\n"] and not conn.scanning  # nothing outstanding: back to hiredis

    asyncio.run(body())


class FakeTransport:
    def __init__(self) -> None:
        self.out: list[bytes] = []
        self.paused = False

    def write(self, data: bytes) -> None:
        self.out.append(data)

    def get_write_buffer_size(self) -> int:
        return 0

    def get_extra_info(self, name: str) -> None:
        return None

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def close(self) -> None:
        pass


def test_a_proxy_relays_a_read_as_one_batch_and_pauses_a_deep_pipeline_by_commands() -> None:
    from mlsyskit.tools.kv.frontend.connection import ClientConnection
    from mlsyskit.tools.kv.frontend.expiry import ActiveExpiry
    from mlsyskit.tools.kv.frontend.session import PIPELINE_PAUSE
    from mlsyskit.tools.kv.node.runtime import Node
    from mlsyskit.tools.kv.shardmap import layout

    async def body():
        proxy = Node(layout("ms-sc", "memory", 1, 1, "127.0.0.1", [1]), None, None)
        link = proxy.link("s0r0")
        link.conn = RelayConnection()
        link.conn.transport = FakeTransport()
        client = ClientConnection(proxy, ActiveExpiry(proxy))
        client.transport = FakeTransport()
        read = b"".join(hiredis.pack_command((b"GET", b"k%d" % i)) for i in range(16))
        client.data_received(read)
        assert len(client.slots) == 1 and proxy.stats["batches"] == 1  # one slot, one frame for 16 GETs
        await asyncio.sleep(0)  # the link's flush
        link.conn.data_received(b"$1\r\nv\r\n" + b"$-1\r\n" * 15)
        await asyncio.sleep(0)  # the client's flush
        assert b"".join(client.transport.out) == b"$1\r\nv\r\n" + b"$-1\r\n" * 15  # the node's bytes as they came
        reads = 0
        while not client.transport.paused:  # the node answers nothing more
            client.data_received(read)
            reads += 1
        assert reads * 16 == PIPELINE_PAUSE + 16  # paused by commands waiting, not by reads
        link.conn.data_received(b"$-1\r\n" * 16 * (reads - PIPELINE_PAUSE // 32))
        assert client.transport.paused  # still over half of the limit
        link.conn.data_received(b"$-1\r\n" * 16 * 2)
        assert not client.transport.paused

    asyncio.run(body())
