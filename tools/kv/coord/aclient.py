"""An asyncio client for the embedded coordinator's line-JSON protocol (protocol.py), for node processes.

Nodes talk to the coordinator from their event loop, so a blocking CoordClient would stall
replication while a coordinator is slow or being replaced. Each request has a deadline; a
broken or silent connection moves on to the next address (leader, then standby), and a request
that no address answers raises CoordUnavailable, which callers treat as "try again next beat".
"""
from __future__ import annotations

import asyncio
import json
from typing import Any

from mlsyskit.tools.kv.peerauth import coord_proof
from mlsyskit.tools.kv.shardmap import ShardMap


class CoordUnavailable(Exception):
    """No coordinator address answered within the deadline."""


class CoordRefused(Exception):
    """The coordinator answered with an error (conflict, bad request, refusal)."""


class AsyncCoordClient:
    def __init__(self, addrs: list[tuple[str, int]], timeout_s: float = 1.0, secret: bytes | None = None) -> None:
        if not addrs:
            raise ValueError("a coordinator client needs at least one address")
        self.addrs = list(addrs)
        self.timeout_s = timeout_s
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.lock = asyncio.Lock()  # one request at a time per connection (replies are not tagged)
        self.secret = secret  # proved on each new connection (protocol.Session)

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None

    async def request(self, op: str, **fields: Any) -> dict:
        payload = json.dumps({"op": op, **fields}).encode() + b"\n"
        async with self.lock:
            errors = []
            for _ in range(len(self.addrs)):
                try:
                    if self.writer is None:
                        host, port = self.addrs[0]
                        self.reader, self.writer = await asyncio.wait_for(
                            asyncio.open_connection(host, port, limit=1 << 21), self.timeout_s)
                        if self.secret is not None:
                            await self._authenticate()
                    reply = await self._round_trip(payload)
                    break
                except (OSError, TimeoutError, ValueError, asyncio.IncompleteReadError) as e:
                    errors.append(f"{self.addrs[0][0]}:{self.addrs[0][1]}: {e!r}")
                    await self.close()
                    self.addrs.append(self.addrs.pop(0))  # the next address (a standby that took over)
            else:
                raise CoordUnavailable("; ".join(errors))
        if not reply.get("ok"):
            raise CoordRefused(f"{reply.get('kind')}: {reply.get('error')}")
        return reply

    async def _round_trip(self, payload: bytes) -> dict:
        self.writer.write(payload)
        line = await asyncio.wait_for(self.reader.readline(), self.timeout_s)
        if not line:
            raise ConnectionError("coordinator closed the connection")
        return json.loads(line)

    async def _authenticate(self) -> None:
        hello = await self._round_trip(b'{"op": "hello"}\n')
        proof = coord_proof(self.secret, bytes.fromhex(hello.get("nonce") or ""))
        reply = await self._round_trip(json.dumps({"op": "auth", "proof": proof}).encode() + b"\n")
        if not reply.get("ok"):
            await self.close()
            raise CoordRefused(f"the coordinator refused this node: {reply.get('error')}")

    async def map(self) -> ShardMap | None:
        d = (await self.request("map"))["map"]
        return None if d is None else ShardMap.from_dict(d)

    async def register(self, node: str, host: str, port: int) -> None:
        await self.request("register", node=node, host=host, port=port)

    async def heartbeat(self, node: str, applied: int | None) -> tuple[bool, int | None]:
        fields: dict[str, Any] = {"node": node}
        if applied is not None:
            fields["applied"] = applied
        reply = await self.request("heartbeat", **fields)
        return bool(reply["known"]), reply.get("epoch")

    async def join(self, shard: int, node: str, host: str, port: int) -> ShardMap:
        reply = await self.request("join", shard=shard, node=node, host=host, port=port)
        return ShardMap.from_dict(reply["map"])
