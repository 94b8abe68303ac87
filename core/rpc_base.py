"""The parts of core.rpc that servers and clients share: errors, keep-alive, TLS settings, encoding.

core.rpc (the server) and core.rpc_client import this; core.rpc re-exports its public names.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# gRPC's C core prints info lines of its own on stderr (e.g. "Handshake failed ... WRONG_VERSION_NUMBER"
# for every plaintext client at a TLS port), without the peer's address; our own messages say what
# happened. Errors still show; a user who wants its traces sets GRPC_VERBOSITY/GRPC_TRACE explicitly.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
import grpc  # noqa: E402 (after the environment above)

from mlsyskit.core.rpc_codec import CodecError, decode, encode  # noqa: E402

StatusCode = grpc.StatusCode
DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
_TOKEN_KEY = "authorization"
# codes a lost or restarted peer produces (refused, reset, torn-down stream, a server killed mid-call):
# worth reconnecting after; anything else is an answer that a retry would only repeat
TRANSPORT_FAILURES = frozenset({StatusCode.UNAVAILABLE, StatusCode.INTERNAL, StatusCode.CANCELLED,
                                StatusCode.DEADLINE_EXCEEDED, StatusCode.UNKNOWN, StatusCode.ABORTED})


class RpcError(Exception):
    """A failed call: `code` is a grpc.StatusCode, `message` says what happened in plain words."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def __str__(self) -> str:
        return f"{self.message} [{self.code.name}]"


@dataclass(frozen=True)
class KeepAlive:
    """HTTP/2 pings that detect a dead peer on an idle connection."""

    interval_s: float = 30.0
    timeout_s: float = 10.0

    def options(self) -> list[tuple[str, int]]:
        return [("grpc.keepalive_time_ms", int(self.interval_s * 1000)),
                ("grpc.keepalive_timeout_ms", int(self.timeout_s * 1000)),
                ("grpc.keepalive_permit_without_calls", 1),
                ("grpc.http2.max_pings_without_data", 0)]


@dataclass(frozen=True)
class ServerTls:
    cert_chain: bytes
    private_key: bytes
    client_ca: bytes | None = None  # set -> clients must present a certificate signed by it

    @classmethod
    def from_files(cls, cert: str | Path, key: str | Path, client_ca: str | Path | None = None) -> ServerTls:
        return cls(_read(cert, "TLS certificate"), _read(key, "TLS key"),
                   _read(client_ca, "client CA") if client_ca else None)


@dataclass(frozen=True)
class ClientTls:
    ca: bytes | None = None  # None -> the system trust store
    cert_chain: bytes | None = None
    private_key: bytes | None = None
    server_name: str | None = None  # override the name checked against the server certificate

    @classmethod
    def from_files(cls, ca: str | Path | None = None, cert: str | Path | None = None,
                   key: str | Path | None = None, server_name: str | None = None) -> ClientTls:
        return cls(_read(ca, "TLS CA") if ca else None, _read(cert, "TLS certificate") if cert else None,
                   _read(key, "TLS key") if key else None, server_name)


def _read(path: str | Path | None, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise RpcError(StatusCode.INVALID_ARGUMENT, f"cannot read {what} {path}: {e.strerror}") from None


def _message_options(max_message_bytes: int) -> list[tuple[str, int]]:
    return [("grpc.max_send_message_length", max_message_bytes),
            ("grpc.max_receive_message_length", max_message_bytes)]


def _encode_request(method: str, payload: Any) -> bytes:
    try:
        return encode(payload)
    except CodecError as e:
        raise RpcError(StatusCode.INVALID_ARGUMENT, f"cannot send {method}: {e}") from None


def _decode_reply(method: str, reply: bytes) -> Any:
    try:
        return decode(reply)
    except CodecError as e:
        raise RpcError(StatusCode.DATA_LOSS, f"bad reply to {method}: {e}") from None


def _unreachable_reason(details: str) -> str:
    lowered = details.lower()
    if "connection refused" in lowered:
        return "connection refused"
    if "handshake" in lowered or "ssl" in lowered or "certificate" in lowered:
        return f"TLS handshake failed ({details.strip()})"
    if "dns" in lowered or "resolve" in lowered:
        return f"cannot resolve the address ({details.strip()})"
    return details.strip() or "unavailable"
