#!/usr/bin/env python3
"""No failover without a fault on a busy host, then a kill -9 detected (issue 22 item 3).

    .venv/bin/python scripts/bench_kv_busy.py --seconds 60 --modes ms-sc,ms-ec,aa-sc,aa-ec --out runs/kv_busy

Per mode: a 1 shard x 3 replica cluster of real node processes under the embedded coordinator
(default heartbeat and failure timeout), a CPU hog busy-looping on every core, and redis-benchmark
(the C load generator) `-P 16 -c 50` SETs at the first replica and GETs at the last, and one
client with 100,000 GETs pipelined (`-c 1 -P 100000`, the load that failed nodes over before)
at the last, for `--seconds`. Counted: the failovers during the load (new map epochs; 0
expected: no fault was injected), whether each load generator ran to the end (redis-benchmark
exits on the first error reply, so one that stopped early met an error) and its final rate. Then the first replica (head, master,
sequencer) is killed with kill -9, still beside the hog, and the detection time is measured: kill
to the coordinator's map without it (target <= 5 s). os.getloadavg() goes into the JSON.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from kvbench.recovery import _cluster, _wait_epoch_above  # noqa: E402 - the recovery benchmark's cluster

from mlsyskit.core.clock import RealClock  # noqa: E402

HOG = "import time\nwhile True:\n    time.perf_counter()\n"


def _bench(port: int, test: str, pipeline: int = 16, clients: int = 50) -> subprocess.Popen:
    return subprocess.Popen(["redis-benchmark", "-h", "127.0.0.1", "-p", str(port), "-P", str(pipeline),
                             "-c", str(clients), "-t", test, "-n", str(10**9), "-r", "10000", "-d", "100", "-q"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _stop(proc: subprocess.Popen) -> str:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
    out = proc.communicate()[0] or ""
    return out.replace("\r", "\n").strip().splitlines()[-1] if out.strip() else ""


async def one_mode(mode: str, seconds: float, out_dir: Path, hogs: int) -> dict[str, Any]:
    clock = RealClock()
    cluster = await _cluster(mode, out_dir, clock, heartbeat=0.5, misses=3)
    hog_procs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(hogs)]
    try:
        smap = cluster.map
        first, last = smap.shards[0][0], smap.shards[0][-1]
        epoch0 = (await cluster.current_map()).epoch
        loads = {"set": _bench(smap.nodes[first].port, "set"), "get": _bench(smap.nodes[last].port, "get"),
                 "get_p100k": _bench(smap.nodes[last].port, "get", pipeline=100_000, clients=1)}
        began, epochs = time.monotonic(), set()
        while time.monotonic() - began < seconds:
            epochs.add((await cluster.current_map()).epoch)
            await asyncio.sleep(0.5)
        load_avg = os.getloadavg()
        ran_through = {name: p.poll() is None for name, p in loads.items()}  # an error reply ends it early
        lines = {name: _stop(p) for name, p in loads.items()}
        epoch1 = (await cluster.current_map()).epoch
        killed = clock.now()
        await cluster.kill(first)
        committed = await _wait_epoch_above(cluster, epoch1, clock)
        return {"mode": mode, "seconds": seconds, "hogs": hogs, "failovers_under_load": epoch1 - epoch0,
                "epochs_seen": sorted(epochs), "redis_benchmark": lines, "ran_through": ran_through,
                "detection_s": round(committed - killed, 3), "loadavg": [round(x, 2) for x in load_avg]}
    finally:
        for p in hog_procs:
            p.kill()
            p.wait()
        await cluster.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--modes", default="ms-sc,ms-ec,aa-sc,aa-ec")
    ap.add_argument("--hogs", type=int, default=os.cpu_count() or 2, help="busy-looping processes")
    ap.add_argument("--out", type=Path, default=None, help="directory for the JSON and the clusters' logs")
    args = ap.parse_args()
    if shutil.which("redis-benchmark") is None:
        print("error: redis-benchmark not found (apt-get install redis-tools)", file=sys.stderr)
        return 1
    out = args.out or Path(tempfile.mkdtemp(prefix="kv_busy_"))
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for mode in args.modes.split(","):
        row = asyncio.run(one_mode(mode, args.seconds, out / mode, args.hogs))
        rows.append(row)
        print(f"{mode:6} failovers under load {row['failovers_under_load']}  detection {row['detection_s']:.2f} s  "
              f"load {row['loadavg'][0]:.1f}  ran through {row['ran_through']}  {row['redis_benchmark']}", file=sys.stderr)
    ok = all(r["failovers_under_load"] == 0 and r["detection_s"] <= 5.0 and all(r["ran_through"].values())
             for r in rows)
    result = {"runs": rows, "targets_met": ok}
    (out / "kv_busy.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
