"""Link.call_back (node/links.py): forwarded calls resolved in place, without a Future per call.

A loopback RESP server answers `+OK` to PING and an error to anything else; the callbacks must see
every reply in order (errors as exceptions, as a Future would carry them), calls made before the
link connected must be answered too, a raising callback must not stop the replies after it, and a
link that cannot connect must fail its waiting callbacks.
"""
from __future__ import annotations

import asyncio

import pytest

from mlsyskit.core.clock import VirtualClock
from mlsyskit.core.net import free_port
from mlsyskit.tools.kv.client.pipeline import ConnectionLost
from mlsyskit.tools.kv.node.links import Link, Waiter

pytestmark = pytest.mark.slow  # listens on a loopback socket


class _Echo(asyncio.Protocol):
    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        for line in data.split(b"\r\n"):
            if line == b"PING":
                self.transport.write(b"+OK\r\n")
            elif line == b"FAIL":
                self.transport.write(b"-ERR asked to fail\r\n")


def _frame(word: bytes) -> bytes:
    return b"*1\r\n$%d\r\n%b\r\n" % (len(word), word)


async def _until(cond, timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not cond():
        assert loop.time() < deadline, "condition not reached"
        await asyncio.sleep(0.005)


def test_call_back_answers_in_order_before_and_after_connecting() -> None:
    async def main() -> None:
        port = free_port()
        server = await asyncio.get_running_loop().create_server(_Echo, "127.0.0.1", port)
        link = Link("127.0.0.1", port)
        seen: list[tuple[int, object]] = []

        def record(i: int):
            def fn(w: Waiter) -> None:
                assert w.done()
                seen.append((i, w.exception() or w.result()))
            return fn

        words = [b"PING", b"FAIL", b"PING"]
        for i, word in enumerate(words):  # queued: the link is still connecting
            link.call_back(_frame(word), record(i))
        await _until(lambda: len(seen) == 3)

        def boom(w: Waiter) -> None:
            raise RuntimeError("a callback that raises")
        errors: list[dict] = []
        asyncio.get_running_loop().set_exception_handler(lambda loop, ctx: errors.append(ctx))
        link.call_back(_frame(b"PING"), boom)
        for i, word in enumerate(words, start=3):  # connected now: straight onto the connection
            link.call_back(_frame(word), record(i))
        await _until(lambda: len(seen) == 6)
        await link.close()
        server.close()
        assert [i for i, _ in seen] == list(range(6))
        for i, answer in seen:
            if words[i % 3] == b"FAIL":
                assert "asked to fail" in str(answer)
            else:
                assert answer == b"OK"
        assert len(errors) == 1 and isinstance(errors[0]["exception"], RuntimeError)

    asyncio.run(main())


def test_call_back_fails_when_the_link_gives_up() -> None:
    async def main() -> None:
        port = free_port()  # nobody listens there
        gave_up: list[int] = []
        link = Link("127.0.0.1", port, clock=VirtualClock(), attempts=2, on_give_up=gave_up.append)
        seen: list[BaseException | None] = []
        for _ in range(3):
            link.call_back(_frame(b"PING"), lambda w: seen.append(w.exception()))
        await _until(lambda: len(seen) == 3)
        assert all(isinstance(e, ConnectionLost) for e in seen)
        assert gave_up == [3]
        w = Waiter(lambda _: None)  # result() raises what the call failed with, as Future.result does
        w.set_exception(seen[0])
        with pytest.raises(ConnectionLost):
            w.result()

    asyncio.run(main())
