"""Relaying a batch's replies as the bytes they came in: a proxy's zero-copy reply path (issue 22).

A proxy sends a connection's pipelined plain GETs (or SETs) to their node as one frame; their n
replies come back in order, and when none is an error each is exactly the bytes the proxy would
have encoded for its client (resp.bulk of the value, +OK). So the link's connection
(RelayConnection) does not parse them into Python objects to encode them again: it finds where
the n replies end (a scan of their headers, `reply_end`) and hands the batch's bytes on as one
string. A batch with an error reply, or with a reply of an unexpected type, is parsed after all
and settled reply by reply (held and retried, re-encoded) as before.

Replies are found by the scan only while the connection is in scan mode; every other reply in scan
mode is cut out by the scan too and fed whole to hiredis, so hiredis never holds part of a reply
and the two parsers cannot disagree on where one ends. Scan mode starts only when nothing is
outstanding (hiredis holds nothing), and ends once nothing is outstanding again.
"""
from __future__ import annotations

from collections.abc import Callable

import hiredis

from mlsyskit.tools.kv.client.pipeline import RespConnection

BULK, SIMPLE, ERROR, INTEGER, ARRAY = 36, 43, 45, 58, 42  # the first byte of a RESP2 reply


class Incomplete(Exception):
    """The buffer ends inside a reply; `need` is a length the buffer must reach for progress."""

    def __init__(self, need: int) -> None:
        self.need = need


def reply_end(buf: bytes | bytearray, pos: int) -> int:
    """Where the RESP2 reply starting at `pos` ends (raises Incomplete, or hiredis.ProtocolError)."""
    e = buf.find(b"\r\n", pos)
    if e < 0:
        raise Incomplete(len(buf) + 1)
    t = buf[pos]
    if t == BULK:
        size = int(buf[pos + 1:e])
        if size < 0:
            return e + 2
        end = e + 4 + size
        if end > len(buf):
            raise Incomplete(end)
        return end
    if t == SIMPLE or t == ERROR or t == INTEGER:
        return e + 2
    if t == ARRAY:
        p = e + 2
        for _ in range(int(buf[pos + 1:e])):
            p = reply_end(buf, p)
        return p
    raise hiredis.ProtocolError(f"unexpected reply type {bytes([t])!r} on a peer link")


class RawBatch:
    """A waiter for the n replies of one frame: on_raw(bytes) when they are all of type `expect`,
    else on_parsed(list of values or exceptions), as links.Replies delivers them."""

    __slots__ = ("left", "n", "expect", "on_raw", "on_parsed", "parts", "odd")

    def __init__(self, n: int, expect: int, on_raw: Callable[[bytes], None],
                 on_parsed: Callable[[list], None]) -> None:
        self.left = self.n = n
        self.expect = expect
        self.on_raw, self.on_parsed = on_raw, on_parsed
        self.parts: list[bytes] = []
        self.odd = False  # a reply of another type (an error): the batch is parsed and settled one by one

    def done(self) -> bool:
        return self.left == 0

    def finish(self) -> None:
        raw = self.parts[0] if len(self.parts) == 1 else b"".join(self.parts)
        if not self.odd:
            self.on_raw(raw)
            return
        self.on_parsed(parse_replies(raw, self.n))

    def set_exception(self, error: BaseException) -> None:
        """The connection was lost with `left` replies missing: those fail with `error`."""
        replies = parse_replies(b"".join(self.parts), self.n - self.left) + [error] * self.left
        self.left = 0
        self.on_parsed(replies)


def parse_replies(raw: bytes, n: int) -> list:
    reader = hiredis.Reader()
    reader.feed(raw)
    return [reader.gets() for _ in range(n)]  # a reply error comes back as a hiredis.ReplyError value


class RelayConnection(RespConnection):
    """A peer link's connection: RespConnection, plus batches whose replies are relayed raw."""

    def __init__(self) -> None:
        super().__init__()
        self.scanning = False
        self.buf = bytearray()  # scan mode: received bytes not yet resolved
        self.need = 0  # the scan needs the buffer to reach this length before it can go on

    def call_raw(self, frame: bytes, batch: RawBatch) -> bool:
        """Send `frame` (batch.n commands) with its replies relayed raw; False, nothing sent, when
        hiredis may hold part of an earlier reply (the caller then uses a parsed batch)."""
        if self.closed or not (self.scanning or not self.waiters):
            return False
        self.scanning = True
        self.waiters.append(batch)
        self.send(frame)
        return True

    def data_received(self, data: bytes) -> None:
        if not self.scanning:
            super().data_received(data)
            return
        buf = self.buf
        if buf:
            buf += data
            if len(buf) < self.need:
                return
        else:
            buf = data
        pos = self._scan(buf)
        if pos < len(buf):
            rest = buf[pos:]
            if not self.waiters:  # bytes nobody waits for: back to hiredis, which drops them as ever
                self.scanning, self.buf, self.need = False, bytearray(), 0
                super().data_received(bytes(rest))
                return
            self.buf = bytearray(rest)
            self.need -= pos
        else:
            self.buf, self.need = bytearray(), 0
            if not self.waiters:
                self.scanning = False

    def _scan(self, buf: bytes | bytearray) -> int:
        """Resolve the waiters whose replies `buf` holds whole; returns where it stopped."""
        waiters, pos, size = self.waiters, 0, len(buf)
        reader = self.reader
        self.need = 0
        try:
            while waiters and pos < size:
                w = waiters[0]
                if type(w) is RawBatch:
                    start, expect, find = pos, w.expect, buf.find
                    if expect == SIMPLE and pos + 5 * w.left <= size \
                            and buf.count(b"+OK\r\n", pos, pos + 5 * w.left) == w.left:
                        # a SET batch's replies, all +OK: k of them fill their 5k bytes exactly
                        # (non-overlapping), found in one C call instead of a step per reply
                        pos += 5 * w.left
                        w.left = 0
                    try:
                        while w.left and pos < size:
                            t = buf[pos]
                            if t == BULK:  # reply_end's bulk string, inlined: nearly every GET reply
                                e = find(b"\r\n", pos)
                                if e < 0:
                                    raise Incomplete(size + 1)
                                n = int(buf[pos + 1:e])
                                end = e + 4 + n if n >= 0 else e + 2
                                if end > size:
                                    raise Incomplete(end)
                            elif buf.startswith(b"+OK\r\n", pos):  # every SET reply
                                end = pos + 5
                            else:
                                end = reply_end(buf, pos)
                            if t != expect:
                                w.odd = True
                            pos = end
                            w.left -= 1
                    finally:  # the replies it holds whole, also when the next one is incomplete
                        if pos > start:
                            w.parts.append(bytes(buf[start:pos]))
                    if w.left:
                        break
                    waiters.popleft()
                    self.replies += w.n
                    w.finish()
                    continue
                end = reply_end(buf, pos)
                reader.feed(bytes(buf[pos:end]))
                pos = end
                reply = reader.gets()
                self.replies += 1
                waiters.popleft()
                if w.done():
                    continue
                if isinstance(reply, hiredis.ReplyError):
                    w.set_exception(reply)
                else:
                    w.set_result(reply)
        except Incomplete as inc:
            self.need = inc.need
        return pos
