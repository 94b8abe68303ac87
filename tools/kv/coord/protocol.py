"""The embedded coordinator's wire protocol: one JSON object per line each way, I/O-free dispatch.

    request  {"op": "map"} | {"op": "init", "map": {...}} | {"op": "cas", "expected_epoch": E, "map": {...}}
             {"op": "register", "node": ID, "host": H, "port": P} | {"op": "heartbeat", "node": ID, "applied": N?}  -> {"known", "epoch"}
             {"op": "join", "shard": S, "node": ID, "host": H, "port": P}
             {"op": "live"} | {"op": "members"} | {"op": "status"}
    reply    {"ok": true, ...} | {"ok": false, "kind": "conflict"|"bad_request"|"refused", "error": TEXT}

Anything malformed gets a "bad_request" reply; a request can never raise out of `handle`.

With a cluster secret (peerauth.py) each connection is a `Session` that must authenticate first:

    {"op": "hello"} -> {"nonce": HEX}        16 fresh random bytes, good for one auth on this connection
    {"op": "auth", "proof": HEX}             HMAC-SHA256(secret, "bespokv-coord" | nonce)

and every other request before that is refused ("refused", "authenticate first ...").
"""
from __future__ import annotations

import hmac
import json
from typing import Any

from mlsyskit.core.config import ConfigError
from mlsyskit.core.errors import UserError
from mlsyskit.tools.kv.coord.base import EpochConflict
from mlsyskit.tools.kv.coord.embedded import EmbeddedCoordinator
from mlsyskit.tools.kv.coord.orchestrator import join
from mlsyskit.tools.kv.peerauth import coord_proof, new_nonce
from mlsyskit.tools.kv.shardmap import NodeAddr, ShardMap

MAX_LINE = 1 << 20  # a shard map of thousands of nodes fits; anything larger is refused


class BadRequest(Exception):
    pass


def _field(req: dict, name: str, kind: type) -> Any:
    value = req.get(name)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise BadRequest(f"field {name!r} must be {kind.__name__}, got {type(value).__name__}")
    return value


def _node(req: dict) -> NodeAddr:
    port = _field(req, "port", int)
    if not 0 < port < 65536:
        raise BadRequest(f"port out of range: {port}")
    return NodeAddr(_field(req, "node", str), _field(req, "host", str), port)


def _map_dict(m: ShardMap | None) -> dict | None:
    return None if m is None else m.to_dict()


class Session:
    """One client connection: with a secret, nothing but hello/auth until the client proved it."""

    def __init__(self, secret: bytes | None) -> None:
        self.secret = secret
        self.authenticated = secret is None
        self.nonce: bytes | None = None

    def handle(self, coord: EmbeddedCoordinator, line: bytes) -> dict:
        if self.authenticated:  # parsed once, by handle (hello/auth are answered there too)
            return handle(coord, line)
        try:
            req = json.loads(line)
            op = req.get("op") if isinstance(req, dict) else None
        except (ValueError, RecursionError):
            op = None
        if op == "hello":
            self.nonce = new_nonce()
            return {"ok": True, "nonce": self.nonce.hex()}
        if op == "auth":
            nonce, self.nonce = self.nonce, None  # one try per nonce
            claimed = req.get("proof")
            if nonce is not None and isinstance(claimed, str) and hmac.compare_digest(
                    coord_proof(self.secret, nonce).encode(), claimed.encode("utf-8", "replace")):
                self.authenticated = True
                return {"ok": True}
            return {"ok": False, "kind": "refused", "error": "authentication failed (wrong cluster secret?)"}
        return {"ok": False, "kind": "refused",
                "error": "authenticate first (hello, then auth with the cluster secret)"}


def handle(coord: EmbeddedCoordinator, line: bytes) -> dict:
    """One request line in, one reply object out."""
    try:
        req = json.loads(line)
        if not isinstance(req, dict):
            raise BadRequest("a request is a JSON object")
        return {"ok": True, **_dispatch(coord, req, _field(req, "op", str))}
    except EpochConflict as e:
        return {"ok": False, "kind": "conflict", "error": str(e), "epoch": e.current}
    except (BadRequest, ConfigError, ValueError, TypeError, AttributeError, RecursionError) as e:
        return {"ok": False, "kind": "bad_request", "error": str(e)}
    except UserError as e:
        return {"ok": False, "kind": "refused", "error": str(e)}


def _dispatch(coord: EmbeddedCoordinator, req: dict, op: str) -> dict:
    if op == "hello":  # an authenticated session, or a server without a secret: nothing to prove
        return {"nonce": new_nonce().hex()}
    if op == "auth":
        return {}
    if op == "map":
        return {"map": _map_dict(coord.read_map())}
    if op == "init":
        return {"map": coord.initialize(ShardMap.from_dict(_field(req, "map", dict))).to_dict()}
    if op == "cas":
        new = ShardMap.from_dict(_field(req, "map", dict))
        return {"map": coord.compare_and_set(_field(req, "expected_epoch", int), new).to_dict()}
    if op == "register":
        coord.register(_node(req))
        return {}
    if op == "heartbeat":   # the reply carries the epoch so a node notices a new map at its next beat
        applied = req.get("applied")
        if applied is not None and (not isinstance(applied, int) or isinstance(applied, bool) or applied < 0):
            raise BadRequest("field 'applied' must be a non-negative int")
        known = coord.heartbeat(_field(req, "node", str), applied)
        m = coord.read_map()
        return {"known": known, "epoch": None if m is None else m.epoch}
    if op == "join":
        return {"map": join(coord, _field(req, "shard", int), _node(req)).to_dict()}
    if op == "live":
        return {"live": coord.live()}
    if op == "members":
        return {"members": {n: [a.host, a.port] for n, a in coord.members().items()}}
    if op == "status":
        m = coord.read_map()
        return {"leader": coord.leader(), "epoch": None if m is None else m.epoch, "live": coord.live(),
                "failed": coord.detector.failed()}
    raise BadRequest(f"unknown op {op!r}")
