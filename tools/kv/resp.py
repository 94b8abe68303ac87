"""RESP (the Redis serialisation protocol) encoders and the front end's size limits.

Parsing is hiredis's job (a C reader); this module only builds replies, as bytes, with
the few shapes the front end needs. Constant replies are prebuilt so the hot path does
not allocate them per request.
"""
from __future__ import annotations

from dataclasses import dataclass

from mlsyskit.core.config import require

OK = b"+OK\r\n"
PONG = b"+PONG\r\n"
NULL = b"$-1\r\n"
EMPTY_ARRAY = b"*0\r\n"
ZERO = b":0\r\n"
ONE = b":1\r\n"
_SMALL_INTS = [b":%d\r\n" % i for i in range(256)]


def bulk(value: bytes | None) -> bytes:
    if value is None:
        return NULL
    return b"$%d\r\n%b\r\n" % (len(value), value)


def integer(n: int) -> bytes:
    return _SMALL_INTS[n] if 0 <= n < 256 else b":%d\r\n" % n


def error(message: str) -> bytes:
    """An error reply; newlines would break the frame, so they are flattened."""
    flat = message.replace("\r", " ").replace("\n", " ")
    if not flat.split(" ", 1)[0].isupper():
        flat = "ERR " + flat
    return b"-" + flat.encode() + b"\r\n"


def array(items: list[bytes | None]) -> bytes:
    """An array of bulk strings (None becomes a null bulk, as MGET returns for missing keys)."""
    return b"*%d\r\n" % len(items) + b"".join(bulk(v) for v in items)


@dataclass(frozen=True)
class Limits:
    """Front-end limits: requests over them get a RESP error instead of consuming the server."""

    max_key_bytes: int = 16 * 1024
    max_value_bytes: int = 4 * 1024 * 1024
    max_request_bytes: int = 16 * 1024 * 1024
    max_args: int = 64 * 1024

    def __post_init__(self) -> None:
        require(self.max_key_bytes > 0, "max_key_bytes must be positive")
        require(self.max_value_bytes > 0, "max_value_bytes must be positive")
        require(self.max_request_bytes >= self.max_key_bytes + self.max_value_bytes,
                "max_request_bytes must hold at least one key and one value")
        require(self.max_args >= 3, "max_args must be at least 3")
