"""SmartClient's history is honest: a write that may have been applied is `info`, never `fail`."""
from __future__ import annotations

import asyncio

import pytest

from mlsyskit.tools.kv.client.history import History
from mlsyskit.tools.kv.client.smart import KVError, SmartClient, certainly_not_applied
from mlsyskit.tools.kv.shardmap import layout
from tests.conftest import free_port


def run(coro, timeout: float = 30):
    return asyncio.run(asyncio.wait_for(coro, timeout))


def test_only_front_end_refusals_are_certain() -> None:
    assert certainly_not_applied("ERR wrong number of arguments for 'set' command")
    assert certainly_not_applied("value too large (5000000 > 4194304 bytes)")
    assert certainly_not_applied("TRYAGAIN fenced: s0r2 has no current lease from the coordinator; retry")
    for ambiguous in ("forward failed: connection lost", "TRYAGAIN write timed out", "CLUSTERDOWN",
                      "datalet error: OOM", "anything new"):
        assert not certainly_not_applied(ambiguous)


async def serve(behaviour: str):
    """A one-node fake server: reads one command, then answers per `behaviour`."""
    async def handle(reader, writer):
        await reader.read(65536)
        if behaviour == "reset":
            writer.transport.abort()
        elif behaviour == "silent":
            await asyncio.sleep(3600)  # never answers; cancelled at shutdown
        else:
            writer.write(behaviour.encode())
            await writer.drain()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def outcome(behaviour: str | None, op: str) -> str:
    server, port = await serve(behaviour) if behaviour else (None, free_port())
    history = History()
    client = SmartClient(layout("ms-sc", "memory", 1, 1, "127.0.0.1", [port]), history=history, timeout=0.3)
    try:
        if op == "put":
            await client.put(b"k", b"v")
        elif op == "del":
            await client.delete(b"k")
        else:
            await client.get(b"k")
    except (KVError, OSError, TimeoutError):
        pass
    finally:
        await client.close()
        if server is not None:
            server.close()
    [invoke, done] = history.events
    assert invoke.type == "invoke" and history.pending() == 0
    return done.type


@pytest.mark.slow
@pytest.mark.parametrize(("behaviour", "op", "expected"), [
    ("reset", "put", "info"),  # sent, then the connection died: may have been applied
    ("silent", "put", "info"),  # timed out
    ("-TRYAGAIN write timed out\r\n", "put", "info"),
    ("-TRYAGAIN fenced: s0r0 is not in the shard map (epoch 3); refresh the map\r\n", "put", "fail"),
    ("-ERR forward failed: connection lost\r\n", "del", "info"),
    ("-ERR value too large (9 > 8 bytes)\r\n", "put", "fail"),  # refused before execution
    (None, "put", "fail"),  # connection refused: nothing was sent
    ("reset", "get", "fail"),  # reads have no effect
    ("+OK\r\n", "put", "ok"),
    (":1\r\n", "del", "ok"),
])
def test_outcomes_are_recorded_as_what_the_client_knows(behaviour, op, expected) -> None:
    assert run(outcome(behaviour, op)) == expected
