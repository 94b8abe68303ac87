"""One-shot RESP requests: the one small client for status checks, health probes, digests and
tests (a connection per request; the pipelined client is pipeline.RespConnection).

`call` blocks (the command line, the supervisor, `up`'s readiness wait); `acall` is the same
request from a coroutine. An error reply raises: ConnectionError from `call` (a refusal is as good
as unreachable to its callers), hiredis.ReplyError from `acall`. `authenticated_socket` is a
connected socket past AUTH, for an asyncio client to take over.
"""
from __future__ import annotations

import asyncio
import socket
from typing import Any

import hiredis

from mlsyskit.tools.kv.client.pipeline import RespConnection


def _replies(sock: socket.socket, count: int, closed: str) -> list[Any]:
    reader = hiredis.Reader()
    replies = []
    while len(replies) < count:
        while (reply := reader.gets()) is False:
            data = sock.recv(65536)
            if not data:
                raise ConnectionError(closed)
            reader.feed(data)
        replies.append(reply)
    return replies


def call(host: str, port: int, *parts: bytes | str | int, timeout: float = 1.0,
         password: bytes | None = None) -> Any:
    """One blocking request; AUTH first when the cluster has a password (both leave in one send)."""
    wire = hiredis.pack_command(parts)
    if password is not None:
        wire = hiredis.pack_command((b"AUTH", password)) + wire
    with socket.create_connection((host, port), timeout=timeout) as s:
        s.sendall(wire)
        replies = _replies(s, 2 if password is not None else 1, f"{host}:{port} closed the connection")
    for reply in replies:
        if isinstance(reply, hiredis.ReplyError):
            raise ConnectionError(str(reply))
    return replies[-1]


async def acall(host: str, port: int, *parts: Any, timeout: float = 1.0) -> Any:
    """One request on a fresh connection, from a coroutine."""
    conn = await RespConnection.connect(host, port, timeout=timeout)
    try:
        return await asyncio.wait_for(conn.call(*parts), timeout)
    finally:
        await conn.close()


def authenticated_socket(host: str, port: int, password: bytes, timeout: float = 5.0) -> socket.socket:
    """A connected socket past AUTH (its reply consumed), handed to asyncio non-blocking."""
    sock = socket.create_connection((host, port), timeout=timeout)
    try:
        sock.sendall(hiredis.pack_command((b"AUTH", password)))
        (reply,) = _replies(sock, 1, f"{host}:{port} closed the connection during AUTH")
        if isinstance(reply, hiredis.ReplyError):
            raise ConnectionError(f"{host}:{port} refused AUTH: {reply}")
    except BaseException:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


def parse_info(text: bytes) -> dict[str, str]:
    """An INFO answer's `field:value` lines as a dict."""
    out = {}
    for line in text.decode().splitlines():
        if ":" in line and not line.startswith("#"):
            k, v = line.split(":", 1)
            out[k] = v
    return out
