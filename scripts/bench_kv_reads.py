#!/usr/bin/env python3
"""Point and size reads of a collection, in-process: CPU per call at 10 and at --members members (issue 22).

    .venv/bin/python scripts/bench_kv_reads.py --members 20000 --out docs/results/bench_kv_reads.json

For HGET, HEXISTS, HLEN, SISMEMBER, SCARD, ZSCORE, ZCARD, LLEN, LINDEX (middle), LRANGE (10 at
the middle), and the sorted-set reads off its score index -- ZRANGE (10 at the middle), ZRANK (middle),
ZRANGEBYSCORE (from the middle score, LIMIT 0 10) and ZCOUNT (a middle half) -- on a value of 100-byte members, the CPU seconds per call (time.process_time over
--calls calls, the best of --repeats) of the answer a node gives (redis/queries.answer):

- `view`: on the memory datalet's live value, answered from its structure (live.read_entry);
- `decode_live`: the same live value decoded whole first (values.live: what queries.answer did
  before read_entry, on the client fast path);
- `decode_bytes`: the record's bytes decoded whole (a node's read behind writes did this before,
  and every other datalet still does).

Every answer of the three is checked equal. CPU time, not wall: a busy machine distorts it less;
os.getloadavg() goes into the JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from mlsyskit.tools.kv.redis import queries, rmw, values
from mlsyskit.tools.kv.redis.livelist import LiveList
from mlsyskit.tools.kv.redis.livemap import LiveMap
from mlsyskit.tools.kv.redis.values import HASH, LIST, SET, ZSET


def value_of(kind: bytes, members: list[bytes]):
    if kind == LIST:
        return LiveList.of(0, members)
    data = {SET: lambda: dict.fromkeys(members), HASH: lambda: {m[-20:]: m for m in members},
            ZSET: lambda: {m: float(i) for i, m in enumerate(members)}}[kind]()
    return LiveMap.of(kind, 0, data)


def reads(members: list[bytes]) -> list[tuple[bytes, list[bytes]]]:
    mid = members[len(members) // 2]
    half = len(members) // 2
    return [(HASH, [b"HGET", b"K", mid[-20:]]), (HASH, [b"HEXISTS", b"K", mid[-20:]]), (HASH, [b"HLEN", b"K"]),
            (SET, [b"SISMEMBER", b"K", mid]), (SET, [b"SCARD", b"K"]), (ZSET, [b"ZSCORE", b"K", mid]),
            (ZSET, [b"ZCARD", b"K"]), (LIST, [b"LLEN", b"K"]), (LIST, [b"LINDEX", b"K", b"%d" % half]),
            (LIST, [b"LRANGE", b"K", b"%d" % half, b"%d" % (half + 9)]),
            (ZSET, [b"ZRANGE", b"K", b"%d" % half, b"%d" % (half + 9)]), (ZSET, [b"ZRANK", b"K", mid]),
            (ZSET, [b"ZRANGEBYSCORE", b"K", b"(%d" % half, b"+inf", b"LIMIT", b"0", b"10"]),
            (ZSET, [b"ZCOUNT", b"K", b"%d" % (half // 2), b"(%d" % (half + half // 2)])]


def cpu_per_call(answer, calls: int, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        began = time.process_time()
        for _ in range(calls):
            answer()
        best = min(best, (time.process_time() - began) / calls)
    return best


def ways_of(cmd: list[bytes], value) -> dict:
    """The three ways to answer `cmd` on `value` (the record's bytes are built once, before timing)."""
    handler, stored = queries.READS[cmd[0]][1], value.stored()
    return {"view": lambda: queries.answer(cmd, value, 1),
            "decode_live": lambda: handler(cmd, values.live(value, 1), 1),
            "decode_bytes": lambda: queries.answer(cmd, stored, 1)}


def measure(size: int, calls: int, repeats: int) -> list[dict]:
    members = [b"%0100d" % i for i in range(size)]
    live = {kind: value_of(kind, members) for kind in (HASH, SET, ZSET, LIST)}
    rows = []
    for kind, args in reads(members):
        ways = ways_of(rmw.Command(args), live[kind])
        answers = {name: way() for name, way in ways.items()}
        if len(set(answers.values())) != 1:
            raise RuntimeError(f"{args[0]!r} answers differ at {size} members: {answers}")
        # the slow ways at 20,000 members take ms a call: fewer calls keep the run short
        row = {"command": args[0].decode(), "members": size}
        for name, way in ways.items():
            n = calls if name == "view" or size < 1000 else max(calls // 1000, 5)
            row[f"{name}_us"] = round(cpu_per_call(way, n, repeats) * 1e6, 2)
        rows.append(row)
        print(json.dumps(row), file=sys.stderr)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--members", type=int, default=20_000)
    ap.add_argument("--calls", type=int, default=20_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None, help="write the JSON here too")
    args = ap.parse_args()
    rows = measure(10, args.calls, args.repeats) + measure(args.members, args.calls, args.repeats)
    result = {"members": args.members, "rows": rows, "loadavg": [round(x, 2) for x in os.getloadavg()],
              "view_large_over_small": {r["command"]: round(r["view_us"] / s["view_us"], 2)
                                        for s, r in zip(rows[:len(rows) // 2], rows[len(rows) // 2:], strict=True)}}
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
