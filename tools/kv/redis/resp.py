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
    # A key's value: a string's length or a collection's stored size; CONFIG GET proto-max-bulk-len
    # reports it. Redis allows 512 MiB; bespokv's documented lower limit is 64 MiB. A bulk over it is
    # read (up to max_request_bytes, CONFIG GET client-query-buffer-limit) and answered with an error.
    max_value_bytes: int = 64 * 1024 * 1024
    max_request_bytes: int = 128 * 1024 * 1024
    max_args: int = 64 * 1024
    max_bulk_bytes: int = 512 * 1024 * 1024  # a bulk header over min(this, max_request_bytes) closes the connection
    max_output_bytes: int = 256 * 1024 * 1024  # replies waiting for one client; past it, it is closed
    max_clients: int = 10_000  # Redis's maxclients

    def __post_init__(self) -> None:
        require(self.max_key_bytes > 0, "max_key_bytes must be positive")
        require(self.max_value_bytes > 0, "max_value_bytes must be positive")
        require(self.max_request_bytes >= self.max_key_bytes + self.max_value_bytes,
                "max_request_bytes must hold at least one key and one value")
        require(self.max_args >= 3, "max_args must be at least 3")
        require(self.max_bulk_bytes >= self.max_value_bytes, "max_bulk_bytes must hold a value")
        require(self.max_output_bytes > 0, "max_output_bytes must be positive")
        require(self.max_clients >= 1, "max_clients must be at least 1")

    def max_bulk_bytes_effective(self) -> int:
        """A bulk longer than a whole request may be can never be accepted: refuse it at its header."""
        return min(self.max_bulk_bytes, self.max_request_bytes)


def oversized_tail(data: bytes, max_bulk: int, max_args: int) -> str | None:
    """The length header that ends a read, when it announces more than the limits.

    hiredis waits for a whole frame, so a `$2147483647` header alone would make the server
    wait for (and buffer) 2 GB. The front end calls this only when a request is incomplete
    and the read ends with CRLF, so its last line is the header hiredis is waiting on (or a
    CRLF inside a bulk that happens to end the read, which a `$n` line over the limits could
    only be in a value of that very shape). It looks at that one line: O(1) per read.
    """
    start = data.rfind(b"\r\n", 0, len(data) - 2) + 2
    line = data[start:-2]
    if len(line) < 2 or line[:1] not in (b"$", b"*") or not line[1:].isdigit():
        return None
    n = int(line[1:])
    if line[:1] == b"$" and n > max_bulk:
        return f"invalid bulk length ({n} bytes > {max_bulk})"
    if line[:1] == b"*" and n > max_args:
        return f"invalid multibulk length ({n} arguments > {max_args})"
    return None
