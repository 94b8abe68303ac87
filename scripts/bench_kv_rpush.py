#!/usr/bin/env python3
"""Collections growing one element at a time: bespokv 1 shard x 3 replicas vs Redis (issue 22).

    .venv/bin/python scripts/bench_kv_rpush.py --elements 20000 --rounds 3 --controlet ms-sc \
        --commands RPUSH,SADD,HSET,ZADD,APPEND --out docs/results/bench_kv_collections.json

For each command, one client grows a fresh key by `--elements` elements of `--size` bytes, one
command at a time (each waits for its answer): RPUSH a list, SADD a set (distinct members), HSET a
hash (distinct fields, values of --size bytes), ZADD a sorted set (distinct members, rising scores),
APPEND a string. Against a Redis 7 server and against a cluster of real bespokv node processes
(memory datalet), alternating (Redis, bespokv, Redis, ...) on the same machine. Reported per system
and command: the total seconds, the mean microseconds per command in the first and the last tenth
(a write must not slow down as its value grows), the same in CPU time of the server processes
(redis-server; the three nodes together), which a busy machine distorts far less than wall time,
and bespokv / Redis. With --reads, then as many point reads of the grown key (LINDEX, SISMEMBER,
HGET, ZSCORE, STRLEN) and the server CPU per read. Every answer is checked.

The commands that read or edit a value in place (ZPOPMIN, ZRANGE, ZRANK, ZRANGEBYSCORE, SPOP, LSET,
LTRIM) first grow the key to --elements with a few large ZADD/SADD/RPUSH commands (not measured),
then run --elements of the command, measured as above: ZPOPMIN, SPOP and LTRIM (1 -1) drain the key
from --elements to empty; ZRANGE (10 members), ZRANK and ZRANGEBYSCORE ((score +inf LIMIT 0 10)
walk the ranks of the full key; LSET writes at scattered indexes. os.getloadavg() goes into the JSON; on a busy machine
read the ratios, not the rates.
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
import psutil

from mlsyskit.core.net import free_port, port_is_free
from mlsyskit.tools.kv.check.procs import ProcCluster


def cpu_of(pids: list[int]):
    """A reader of the CPU seconds (user + system) the processes (and their children) used so far."""
    procs = [psutil.Process(p) for p in pids]
    procs += [c for p in procs for c in p.children(recursive=True)]

    def seconds() -> float:
        return sum(sum(p.cpu_times()[:2]) for p in procs)
    return seconds


def growth(command: str, key: bytes, i: int, size: int) -> tuple[tuple, object]:
    """(the command that adds element i, the answer it must get)."""
    item = b"%0*d" % (size, i)  # distinct, --size bytes
    return {"RPUSH": ((b"RPUSH", key, item), i + 1), "SADD": ((b"SADD", key, item), 1),
            "HSET": ((b"HSET", key, b"f%d" % i, item), 1), "ZADD": ((b"ZADD", key, b"%d" % i, item), 1),
            "APPEND": ((b"APPEND", key, item), (i + 1) * size)}[command]


def point_read(command: str, key: bytes, i: int, size: int, elements: int) -> tuple[tuple, object]:
    """(a point or size read of the grown key that finds element i, the answer it must get)."""
    item = b"%0*d" % (size, i)
    return {"RPUSH": ((b"LINDEX", key, b"%d" % i), item), "SADD": ((b"SISMEMBER", key, item), 1),
            "HSET": ((b"HGET", key, b"f%d" % i), item), "ZADD": ((b"ZSCORE", key, item), b"%d" % i),
            "APPEND": ((b"STRLEN", key), elements * size)}[command]


EDITS = {"ZPOPMIN": "ZADD", "ZRANGE": "ZADD", "ZRANK": "ZADD", "ZRANGEBYSCORE": "ZADD", "SPOP": "SADD",
         "LSET": "RPUSH", "LTRIM": "RPUSH"}  # command measured: the growth that makes its key first


def setup(command: str, key: bytes, elements: int, size: int) -> list[tuple]:
    """The few commands (500 elements each) that grow the key an EDITS command reads or edits."""
    base = EDITS[command]
    return [(base.encode(), key, *(a for i in range(start, min(start + 500, elements))
                                    for a in growth(base, key, i, size)[0][2:]))
            for start in range(0, elements, 500)]


def edit(command: str, key: bytes, i: int, size: int, elements: int) -> tuple[tuple, object]:
    """(the i-th measured command on the grown key, the answer it must get)."""
    def item(j: int) -> bytes:
        return b"%0*d" % (size, j)
    j = i % (elements - 11)
    return {"ZPOPMIN": lambda: ((b"ZPOPMIN", key), [item(i), b"%d" % i]),
            "SPOP": lambda: ((b"SPOP", key), lambda reply: isinstance(reply, bytes) and len(reply) == size),
            "ZRANGE": lambda: ((b"ZRANGE", key, b"%d" % j, b"%d" % (j + 9)), [item(j + k) for k in range(10)]),
            "ZRANK": lambda: ((b"ZRANK", key, item(j)), j),
            "ZRANGEBYSCORE": lambda: ((b"ZRANGEBYSCORE", key, b"(%d" % j, b"+inf", b"LIMIT", b"0", b"10"),
                                      [item(j + 1 + k) for k in range(10)]),
            "LSET": lambda: ((b"LSET", key, b"%d" % (i * 7919 % elements), item(i)), b"OK"),
            "LTRIM": lambda: ((b"LTRIM", key, b"1", b"-1"), b"OK")}[command]()


def ask(sock: socket.socket, reader: hiredis.Reader, args: tuple, expected: object, where: str = "") -> None:
    sock.sendall(hiredis.pack_command(args))
    reply = False
    while reply is False:
        reader.feed(sock.recv(65536))
        reply = reader.gets()
    if not expected(reply) if callable(expected) else reply != expected:
        raise RuntimeError(f"{args[0]!r} answered {reply!r}{where} (expected {expected!r})")


def push_round(port: int, key: bytes, elements: int, size: int, cpu, command: str = "RPUSH",
               reads: int = 0) -> dict:
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    reader = hiredis.Reader()
    tenth = max(elements // 10, 1)
    for args in setup(command, key, elements, size) if command in EDITS else []:
        ask(sock, reader, args, lambda reply: not isinstance(reply, hiredis.ReplyError))
    marks, cpu_marks = [], []
    began = time.perf_counter()
    for i in range(elements):
        if i % tenth == 0:
            marks.append(time.perf_counter())
            cpu_marks.append(cpu())
        args, expected = edit(command, key, i, size, elements) if command in EDITS else growth(command, key, i, size)
        ask(sock, reader, args, expected, f" at element {i + 1}")
    end = time.perf_counter()
    marks.append(end)
    cpu_marks.append(cpu())
    read_cpu = cpu()
    for r in range(reads if command not in EDITS else 0):  # of the whole grown value: answered in O(1) (a LINDEX walks to its element)
        ask(sock, reader, *point_read(command, key, r * 7919 % elements, size, elements))
    read_cpu = cpu() - read_cpu
    sock.sendall(hiredis.pack_command((b"DEL", key)))
    reader.feed(sock.recv(65536))
    sock.close()
    per = [(b - a) / tenth * 1e6 for a, b in zip(marks, marks[1:], strict=False)]
    cpu_per = [(b - a) / tenth * 1e6 for a, b in zip(cpu_marks, cpu_marks[1:], strict=False)]
    return {"elements": elements, "seconds": round(end - began, 3), "first_tenth_us": round(per[0], 1), "last_tenth_us": round(per[-1], 1),
            "cpu_seconds": round(cpu_marks[-1] - cpu_marks[0], 3), "first_tenth_cpu_us": round(cpu_per[0], 1),
            "last_tenth_cpu_us": round(cpu_per[-1], 1),
            **({"read_cpu_us": round(read_cpu / reads * 1e6, 1)} if reads else {})}


def summary(rows: list[dict], rounds: int) -> dict:
    """One command's bespokv / Redis ratios per round, and bespokv's last tenth / first tenth."""
    ratios, cpu_ratios = [], []
    for r in range(rounds):
        red, bkv = (next(x for x in rows if x["round"] == r and x["system"] == s) for s in ("redis", "bespokv"))
        ratios.append(round(bkv["seconds"] / red["seconds"], 2))
        cpu_ratios.append(round(bkv["cpu_seconds"] / max(red["cpu_seconds"], 1e-3), 2))
    bkv_rows = [x for x in rows if x["system"] == "bespokv"]
    reads = {f"{s}_read_cpu_us": [x["read_cpu_us"] for x in rows if x["system"] == s and "read_cpu_us" in x]
             for s in ("bespokv", "redis")}
    return {**reads, "time_ratio_bespokv_over_redis": ratios, "cpu_ratio_bespokv_over_redis": cpu_ratios,
            "bespokv_cpu_us_per_op": [round(x["cpu_seconds"] / x["elements"] * 1e6, 1) for x in bkv_rows],
            "redis_cpu_us_per_op": [round(x["cpu_seconds"] / x["elements"] * 1e6, 1)
                                    for x in rows if x["system"] == "redis"],
            "bespokv_last_over_first_tenth": [round(x["last_tenth_us"] / x["first_tenth_us"], 2) for x in bkv_rows],
            "bespokv_cpu_last_over_first_tenth": [round(x["last_tenth_cpu_us"] / max(x["first_tenth_cpu_us"], 1e-3), 2)
                                                  for x in bkv_rows]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--elements", type=int, default=20_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--controlet", default="ms-sc")
    ap.add_argument("--commands", default="RPUSH", help="comma-separated: RPUSH,SADD,HSET,ZADD,APPEND, "
                    "and the in-place reads and edits " + ",".join(EDITS))
    ap.add_argument("--reads", type=int, default=0, help="then this many point reads of the grown key "
                    "(LINDEX, SISMEMBER, HGET, ZSCORE, STRLEN), their server CPU per read reported")
    ap.add_argument("--out", type=Path, default=None, help="write the JSON here too")
    args = ap.parse_args()
    commands = [c.strip().upper() for c in args.commands.split(",") if c.strip()]
    unknown = set(commands) - {"RPUSH", "SADD", "HSET", "ZADD", "APPEND", *EDITS}
    if unknown:
        ap.error(f"unknown --commands {sorted(unknown)}")
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
        cpus = {"redis": cpu_of([redis.pid]), "bespokv": cpu_of([p.pid for p in cluster.procs.values()])}
        for r in range(args.rounds):
            for command in commands:
                for system, port in (("redis", redis_port), ("bespokv", head)):
                    row = {"round": r, "command": command, "system": system,
                           **push_round(port, b"%b%d" % (command.encode(), r), args.elements, args.size,
                                        cpus[system], command, args.reads),
                           "loadavg": [round(x, 2) for x in os.getloadavg()]}
                    rows.append(row)
                    print(json.dumps(row), file=sys.stderr)
    finally:
        asyncio.run(cluster.stop())
        redis.terminate()
        redis.wait()
    result = {"elements": args.elements, "size": args.size, "controlet": args.controlet, "rows": rows,
              "commands": {c: summary([x for x in rows if x["command"] == c], args.rounds) for c in commands}}
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
