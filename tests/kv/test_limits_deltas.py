"""Collections replicated as commands (deltas), not whole values (issue 22, item 1): a push is a
message the size of the command whatever the list's length, and a stored list grows by one copy,
not a decode and re-encode (redis/listpush.py). Replicas compute the same bytes, also when one of
them catches up from a snapshot while pushes go on (the snapshot is the state at SNAPBEGIN, the
deltas after it are replayed once)."""
from __future__ import annotations

import random

import pytest

from mlsyskit.tools.kv.check.simulate import SimShard
from mlsyskit.tools.kv.controlets.base import ControletOptions
from mlsyskit.tools.kv.redis import datatypes, listpush, rmw, values
from mlsyskit.tools.kv.redis.values import LIST, Entry

FAST = ControletOptions(write_timeout=0.5, sync_timeout=0.1, anti_entropy_interval=0.1)
settle = SimShard.answer


def test_the_byte_level_push_decodes_to_what_the_generic_push_gives() -> None:
    rng = random.Random(4)
    starts = [None, values.encode(Entry(LIST, 0, [b"a"])), values.encode(Entry(LIST, 0, [b"x"] * 20)),
              values.encode(Entry(LIST, 99_999, [b"y" * 300] * 3))]
    for start in starts:
        stored, expected = start, (values.decode(start).data if start else [])
        for _ in range(40):
            name = rng.choice([b"RPUSH", b"LPUSH", b"RPUSHX", b"LPUSHX"])
            items = [bytes([97 + rng.randrange(26)]) * rng.choice([1, 30, 300, 70_000]) for _ in range(rng.randrange(1, 4))]
            cmd = rmw.Command([name, b"L", *items], now_ms=1)
            fast = listpush.push(cmd, stored, 1, rmw.MAX_VALUE_BYTES)
            generic_entry, answer = datatypes._push(cmd, values.live(stored, 1), 1)
            if fast is None:
                assert name.endswith(b"X") and stored is None
                continue
            expected = generic_entry.data
            stored = fast[0]
            assert fast[1] == answer and values.decode(stored).data == expected
            assert values.decode(stored).deadline == (values.decode(start).deadline if start else 0)
        assert rmw.apply(rmw.Command([b"RPUSH", b"L", b"z"], now_ms=1), stored)[0] == listpush.push(
            rmw.Command([b"RPUSH", b"L", b"z"], now_ms=1), stored, 1, rmw.MAX_VALUE_BYTES)[0]


def _push(shard: SimShard, node: str, n: int, now_ms: int):
    req = shard.submit(node, "rmw", b"L")
    req.rmw = rmw.Command([b"RPUSH", b"L", b"%0100d" % n], now_ms=now_ms)
    return req


@pytest.mark.parametrize("name", ["ms-sc", "ms-ec", "aa-sc"])
def test_a_push_is_replicated_as_its_command_and_every_replica_holds_the_same_list(name: str) -> None:
    shard = SimShard(name, replicas=3, seed=11, options=FAST)
    origin, sent = shard.controlets["r0"], []
    record = origin.record
    origin.record = lambda fields: (sent.append(fields), record(fields))  # every stream message it numbers
    for n in range(300):
        assert settle(shard, _push(shard, "r0", n, 1000 + n)) == resp_int(n + 1)
    shard.run_for(0.5)
    assert shard.converged()
    assert values.decode(shard.data["r1"][b"L"]).data == [b"%0100d" % n for n in range(300)]
    assert len(sent) == 300 and all(f[-3] == b"R" for f in sent)  # code R: the command,
    assert max(len(f[-1]) for f in sent) < 300  # not the list (30 KB by the end)


def test_a_replica_catching_up_while_pushes_go_on_replays_each_delta_once() -> None:
    shard = SimShard("ms-ec", replicas=3, seed=12, options=FAST)
    for n in range(50):
        settle(shard, _push(shard, "r0", n, 1000 + n))
    shard.crash("r2")
    for n in range(50, 80):
        settle(shard, _push(shard, "r0", n, 1000 + n))
    shard.restart("r2")
    for n in range(80, 200):  # while r2 asks for and receives its snapshot
        settle(shard, _push(shard, "r0", n, 1000 + n))
    shard.run_for(1.0)
    assert shard.controlets["r2"].ready and shard.controlets["r2"].syncs >= 1
    assert shard.converged(), {n: len(values.decode(d[b"L"]).data) for n, d in shard.data.items()}
    assert values.decode(shard.data["r2"][b"L"]).data == [b"%0100d" % n for n in range(200)]


def resp_int(n: int) -> bytes:
    return b":%d\r\n" % n
