"""Replica-to-replica authentication: an HMAC challenge-response with a cluster secret.

A node's links open ordinary RESP connections to other nodes and, before anything else,
prove that they hold the cluster secret:

    link -> node   BKV.NONCE                 node answers 16 fresh random bytes (one use)
    link -> node   BKV.AUTH <me> <proof>     proof = HMAC-SHA256(secret, nonce | me | target)

Only a connection that passed BKV.AUTH may send peer messages (BKV.MSG), and the sender of
every message on it is the authenticated name, never a field the message claims. A client
that knows the shard map (it is public: BKV.SHARDMAP) still cannot forge an ACK, a CHAIN
write or a WACK. The nonce makes a recorded proof useless on another connection, and the
target name makes it useless against another node.

The embedded coordinator's clients (nodes, the supervisor, `bespokv switch`/`status`) prove the
same secret on each connection (hello -> nonce, auth -> HMAC-SHA256(secret, "bespokv-coord" |
nonce)) before any request: without it anyone who reaches the coordinator's port could replace
the shard map or keep a dead node alive with forged heartbeats.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from pathlib import Path

SECRET_FILE = "cluster.secret"
SECRET_BYTES = 32


def new_secret() -> bytes:
    return secrets.token_bytes(SECRET_BYTES)


def new_nonce() -> bytes:
    return secrets.token_bytes(16)


def proof(secret: bytes, nonce: bytes, me: bytes, target: bytes) -> bytes:
    msg = b"bespokv-peer\x00" + nonce + b"\x00" + me + b"\x00" + target
    return hmac.new(secret, msg, hashlib.sha256).hexdigest().encode()


def verify(secret: bytes, nonce: bytes | None, me: bytes, target: bytes, claimed: bytes) -> bool:
    if not nonce:
        return False
    return hmac.compare_digest(proof(secret, nonce, me, target), claimed)


def coord_proof(secret: bytes, nonce: bytes) -> str:
    """A coordinator client's proof that it holds the cluster secret (coord/protocol.py)."""
    return hmac.new(secret, b"bespokv-coord\x00" + nonce, hashlib.sha256).hexdigest()


def read_secret(path: str | Path) -> bytes:
    """The secret in `path` (hex), as written by load_or_create_secret."""
    return bytes.fromhex(Path(path).read_text().strip())


def load_or_create_secret(data_dir: Path) -> bytes:
    """The cluster's secret under data_dir (mode 0600), created atomically by the first caller."""
    path = Path(data_dir) / SECRET_FILE
    try:
        return bytes.fromhex(path.read_text().strip())
    except FileNotFoundError:
        pass
    tmp = path.with_name(f".{SECRET_FILE}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(new_secret().hex())
    try:
        os.link(tmp, path)  # fails if another process won the race; then use theirs
    except FileExistsError:
        pass
    finally:
        tmp.unlink()
    return bytes.fromhex(path.read_text().strip())
