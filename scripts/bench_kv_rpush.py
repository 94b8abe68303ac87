#!/usr/bin/env python3
"""RPUSH of small elements into one growing list: bespokv 1 shard x 3 replicas vs Redis (issue 22).

    .venv/bin/python scripts/bench_kv_rpush.py --elements 20000 --rounds 3 --controlet ms-sc

One client pushes `--elements` elements of `--size` bytes into a fresh list, one command at a
time (each waits for its answer), against a Redis 7 server and against a cluster of real bespokv
node processes (memory datalet), alternating rounds (Redis, bespokv, Redis, ...) on the same
machine. Reported per system: the total seconds, the mean microseconds per push in the first and
the last tenth of the list (a push must not slow down as the list grows), and bespokv / Redis.
os.getloadavg() goes into the JSON; on a busy machine read the ratios, not the rates.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import hiredis

from mlsyskit.core.net import free_port, port_is_free
from mlsyskit.tools.kv.check.procs import ProcCluster


def push_round(port: int, key: bytes, elements: int, size: int) -> dict:
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    reader = hiredis.Reader()
    value = b"x" * size
    tenth = max(elements // 10, 1)
    marks = []
    began = time.perf_counter()
    for i in range(elements):
        if i % tenth == 0:
            marks.append(time.perf_counter())
        sock.sendall(hiredis.pack_command((b"RPUSH", key, value)))
        reply = False
        while reply is False:
            reader.feed(sock.recv(65536))
            reply = reader.gets()
        if reply != i + 1:
            raise RuntimeError(f"RPUSH answered {reply!r} at element {i + 1}")
    end = time.perf_counter()
    marks.append(end)
    sock.sendall(hiredis.pack_command((b"DEL", key)))
    reader.feed(sock.recv(65536))
    sock.close()
    per = [(b - a) / tenth * 1e6 for a, b in zip(marks, marks[1:], strict=False)]
    return {"seconds": round(end - began, 3), "first_tenth_us": round(per[0], 1), "last_tenth_us": round(per[-1], 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--elements", type=int, default=20_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--controlet", default="ms-sc")
    ap.add_argument("--out", type=Path, default=None, help="write the JSON here too")
    args = ap.parse_args()
    if shutil.which("redis-server") is None:
        print("error: redis-server not found (apt-get install redis-server)", file=sys.stderr)
        return 1
    redis_port = free_port()
    redis = subprocess.Popen(["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "",
                              "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    cluster = ProcCluster(args.controlet, "memory", 1, 3, Path(tempfile.mkdtemp(prefix="kv_rpush_")), False)
    rows: list[dict] = []
    try:
        while port_is_free(redis_port):
            time.sleep(0.05)
        asyncio.run(cluster.start())
        head = cluster.map.nodes[cluster.map.shards[0][0]].port
        for r in range(args.rounds):
            for system, port in (("redis", redis_port), ("bespokv", head)):
                row = {"round": r, "system": system, **push_round(port, b"L%d" % r, args.elements, args.size),
                       "loadavg": [round(x, 2) for x in os.getloadavg()]}
                rows.append(row)
                print(json.dumps(row), file=sys.stderr)
    finally:
        asyncio.run(cluster.stop())
        redis.terminate()
        redis.wait()
    ratios = []
    for r in range(args.rounds):
        red, bkv = (next(x for x in rows if x["round"] == r and x["system"] == s) for s in ("redis", "bespokv"))
        ratios.append(round(bkv["seconds"] / red["seconds"], 2))
    bkv_rows = [x for x in rows if x["system"] == "bespokv"]
    result = {"elements": args.elements, "size": args.size, "controlet": args.controlet, "rows": rows,
              "time_ratio_bespokv_over_redis": ratios,
              "bespokv_last_over_first_tenth": [round(x["last_tenth_us"] / x["first_tenth_us"], 2) for x in bkv_rows]}
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
