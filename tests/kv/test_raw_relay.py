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
