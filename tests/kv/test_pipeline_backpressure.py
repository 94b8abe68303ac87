"""A deep pipeline is slowed, not refused (issue 22 item 3: redis-benchmark -P 100000 against aa-sc
stopped on "too many operations waiting for the sequencer"): past PIPELINE_PAUSE unanswered
requests a connection stops reading until half are answered, so one client cannot fill the
controlet's max_pending, and every request of the pipeline is answered."""
from __future__ import annotations

import asyncio

import hiredis
import pytest

from mlsyskit.tools.kv.controlets.base import ControletOptions
from mlsyskit.tools.kv.frontend.session import PIPELINE_PAUSE
from mlsyskit.tools.kv.ops.cluster import LocalCluster
from tests.kv.conftest import datalet_factory, make_map

pytestmark = pytest.mark.slow  # starts an in-process cluster on sockets

DEPTH = 60_000  # > max_pending below: without the pause most of these were refused at once
OPTIONS = ControletOptions(max_pending=PIPELINE_PAUSE + 12_000)  # the pause bound plus one read of GETs


def test_a_pipeline_deeper_than_max_pending_is_answered_in_full_at_an_aa_sc_replica(tmp_path) -> None:
    async def body() -> None:
        smap = make_map("aa-sc", shards=1, replicas=3)
        async with LocalCluster(smap, datalet_factory("memory", tmp_path), options=OPTIONS):
            a = smap.nodes["s0r1"]  # not the sequencer: every GET waits on the sequencer's READOK
            reader, writer = await asyncio.open_connection(a.host, a.port)
            writer.write(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n")
            writer.write(b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n" * DEPTH)
            parser, replies = hiredis.Reader(), []
            while len(replies) < DEPTH + 1:
                chunk = await asyncio.wait_for(reader.read(1 << 16), 60)
                assert chunk, f"the node closed the connection after {len(replies)} replies"
                parser.feed(chunk)
                while (r := parser.gets()) is not False:
                    replies.append(r)
            writer.close()
            errors = [r for r in replies if isinstance(r, hiredis.ReplyError)]
            assert errors == [] and replies[0] == b"OK" and set(replies[1:]) == {b"v"}

    asyncio.run(asyncio.wait_for(body(), 240))
