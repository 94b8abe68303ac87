"""Sizes like Redis (issue 22, item 1): every write that grows a value checks the one value limit
(Limits.max_value_bytes, reported as proto-max-bulk-len) at the write point, before anything is
applied or replicated: over it is one error and the key keeps its bytes."""
from __future__ import annotations

import pytest

from mlsyskit.tools.kv.redis import resp, rmw, values

LIMIT = 1000


def run(current: bytes | None, *args: bytes, limit: int = LIMIT) -> tuple[bytes | None, bytes]:
    return rmw.apply(rmw.parse(list(args), now_ms=1, max_bytes=limit), current)


def test_the_default_limit_is_the_front_ends_and_the_request_limit_holds_a_value() -> None:
    limits = resp.Limits()
    assert rmw.MAX_VALUE_BYTES == limits.max_value_bytes == 64 << 20
    assert limits.max_request_bytes >= limits.max_value_bytes + limits.max_key_bytes + 1024
    assert rmw.parse([b"append", b"k", b"v"]).max_bytes == limits.max_value_bytes


def test_append_past_the_limit_is_refused_and_changes_nothing() -> None:
    stored, answer = run(b"a" * 600, b"APPEND", b"k", b"b" * 400)
    assert answer == resp.integer(1000) and stored == b"a" * 600 + b"b" * 400  # exactly at the limit
    stored, answer = run(stored, b"APPEND", b"k", b"c")
    assert answer.startswith(b"-ERR string exceeds maximum allowed size (proto-max-bulk-len")
    assert stored == b"a" * 600 + b"b" * 400


def test_set_options_and_setex_respect_the_limit_too() -> None:
    assert run(None, b"SET", b"k", b"x" * (LIMIT + 1), b"NX")[1].startswith(b"-ERR string exceeds")
    assert run(None, b"SETEX", b"k", b"10", b"x" * (LIMIT + 1))[1].startswith(b"-ERR string exceeds")
    assert run(None, b"SETEX", b"k", b"10", b"x" * LIMIT)[1] == resp.OK


@pytest.mark.parametrize("grow", [
    (b"RPUSH", b"L"), (b"LPUSH", b"L"), (b"SADD", b"S"), (b"HSET", b"H", b"f"), (b"ZADD", b"Z", b"1"),
])
def test_a_collection_that_would_outgrow_the_limit_is_refused_whole(grow: tuple[bytes, ...]) -> None:
    stored = None
    for i in range(100):  # 100 elements of 20 bytes: past 1000 bytes as stored somewhere on the way
        member = b"%020d" % i
        args = (*grow, member) if grow[0] != b"HSET" else (*grow[:2], member, member)
        after, answer = run(stored, *args)
        if answer.startswith(b"-ERR"):
            assert b"would exceed the maximum size of a value" in answer and after == stored
            break
        assert len(after) <= LIMIT
        stored = after
    else:
        pytest.fail("never refused")
    assert values.decode(stored).data  # the collection is still there, unchanged


def test_lset_that_grows_past_the_limit_is_refused_and_shrinking_is_never_refused() -> None:
    stored, _ = run(None, b"RPUSH", b"L", b"a" * 500, b"b" * 400)
    after, answer = run(stored, b"LSET", b"L", b"0", b"c" * 700)
    assert b"would exceed" in answer and after == stored
    big, _ = run(None, b"RPUSH", b"L", b"a" * 900, b"b" * 900, limit=10_000)
    after, answer = run(big, b"RPOP", b"L")  # already over a lowered limit: popping still works
    assert answer == resp.bulk(b"b" * 900) and values.decode(after).data == [b"a" * 900]
