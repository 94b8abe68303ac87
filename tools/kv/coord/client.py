"""A blocking client for the embedded coordinator's protocol, trying each coordinator address in turn.

    c = CoordClient([("127.0.0.1", 7000), ("127.0.0.1", 7001)])   # leader and standby
    m = c.map(); c.register("s0r3", "127.0.0.1", 7103); c.heartbeat("s0r3")

Connection errors move on to the next address (a standby binds its port only once it leads);
when none answers, RuntimeFailure. Protocol refusals become EpochConflict / RuntimeFailure / UsageError.
"""
from __future__ import annotations

import json
import socket
from typing import Any

from mlsyskit.core.errors import RuntimeFailure, UsageError
from mlsyskit.tools.kv.coord.base import EpochConflict
from mlsyskit.tools.kv.peerauth import coord_proof
from mlsyskit.tools.kv.shardmap import ShardMap


class CoordClient:
    def __init__(self, addrs: list[tuple[str, int]], timeout_s: float = 2.0, secret: bytes | None = None) -> None:
        if not addrs:
            raise UsageError("a coordinator client needs at least one address")
        self.addrs = list(addrs)
        self.timeout_s = timeout_s
        self._sock: socket.socket | None = None
        self._file: Any = None
        self.last_epoch: int | None = None
        self.secret = secret  # proved on each new connection (protocol.Session)

    def _connect(self) -> None:
        errors = []
        for host, port in self.addrs:
            try:
                self._sock = socket.create_connection((host, port), timeout=self.timeout_s)
                self._file = self._sock.makefile("rb")
                if self.secret is not None:
                    self._authenticate()
                self.addrs.remove((host, port))
                self.addrs.insert(0, (host, port))   # remember who answered
                return
            except OSError as e:
                errors.append(f"{host}:{port}: {e.strerror or e}")
        raise RuntimeFailure(f"no coordinator reachable ({'; '.join(errors)})")

    def _round_trip(self, op: str, **fields: Any) -> dict:
        self._sock.sendall(json.dumps({"op": op, **fields}).encode() + b"\n")
        line = self._file.readline()
        if not line:
            raise ConnectionError("coordinator closed the connection")
        return json.loads(line)

    def _authenticate(self) -> None:
        nonce = self._round_trip("hello").get("nonce")
        reply = self._round_trip("auth", proof=coord_proof(self.secret, bytes.fromhex(nonce or "")))
        if not reply.get("ok"):
            self.close()
            raise RuntimeFailure(f"the coordinator refused this client: {reply.get('error')}")

    def close(self) -> None:
        if self._sock is not None:
            self._file.close()
            self._sock.close()
        self._sock = self._file = None

    def request(self, op: str, **fields: Any) -> dict:
        """One round trip; reconnects once (to any address) if the connection broke."""
        payload = json.dumps({"op": op, **fields}).encode() + b"\n"
        for attempt in (1, 2):
            if self._sock is None:
                self._connect()
            try:
                self._sock.sendall(payload)
                line = self._file.readline()
                if not line:
                    raise ConnectionError("coordinator closed the connection")
                break
            except OSError:
                self.close()
                if attempt == 2:
                    raise RuntimeFailure("coordinator connection lost twice in a row") from None
        reply = json.loads(line)
        if reply.get("ok"):
            return reply
        if reply.get("kind") == "conflict":
            raise EpochConflict(fields.get("expected_epoch", -1), reply.get("epoch"))
        if reply.get("kind") == "bad_request":
            raise UsageError(f"coordinator refused the request: {reply.get('error')}")
        raise RuntimeFailure(f"coordinator refused the request: {reply.get('error')}")

    def map(self) -> ShardMap | None:
        d = self.request("map")["map"]
        return None if d is None else ShardMap.from_dict(d)

    def init(self, shard_map: ShardMap) -> ShardMap:
        return ShardMap.from_dict(self.request("init", map=shard_map.to_dict())["map"])

    def cas(self, expected_epoch: int, new_map: ShardMap) -> ShardMap:
        return ShardMap.from_dict(self.request("cas", expected_epoch=expected_epoch, map=new_map.to_dict())["map"])

    def register(self, node: str, host: str, port: int) -> None:
        self.request("register", node=node, host=host, port=port)

    def heartbeat(self, node: str, applied: int | None = None) -> bool:
        """True while the node is a live member; `last_epoch` is the map's epoch from the reply."""
        fields = {"node": node} if applied is None else {"node": node, "applied": applied}
        reply = self.request("heartbeat", **fields)
        self.last_epoch = reply.get("epoch")
        return bool(reply["known"])

    def join(self, shard: int, node: str, host: str, port: int) -> ShardMap:
        return ShardMap.from_dict(self.request("join", shard=shard, node=node, host=host, port=port)["map"])

    def live(self) -> list[str]:
        return list(self.request("live")["live"])

    def status(self) -> dict:
        return self.request("status")
