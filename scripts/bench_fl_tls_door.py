#!/usr/bin/env python
"""What fl-server's TLS door costs: the same mutual-TLS job behind the door and on gRPC's port directly.

The server runs in this process (so its CPU is this process's CPU) with three real fl-client
processes on loopback, digits MLP, FedAvg with all three every round, one local epoch, `--rounds`
rounds. Per run: server CPU milliseconds per round and round wall milliseconds over rounds 3..N
(round 1-2 include the clients' start-up). Door and direct runs alternate, `--repeats` times each;
the table shows medians. The door is a peer of the direct port in the same run, not a target.

    .venv/bin/python scripts/bench_fl_tls_door.py --repeats 3 --out runs/bench_fl_tls_door.json
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mlsyskit.core.console import emit_table, log, make_table
from mlsyskit.core.rpc import ServerTls
from mlsyskit.core.rpc_tls import issue_certs
from mlsyskit.core.storage import MetaStore
from mlsyskit.tools.fl.config import DataSpec, JobConfig, TrainSpec
from mlsyskit.tools.fl.server import FlServer
from mlsyskit.tools.fl.threads import single_threaded

CLIENTS = 3


def one_run(door: bool, rounds: int, work: Path, files, tls: ServerTls, index: int) -> dict:
    config = JobConfig(strategy="fedavg", rounds=rounds, per_round=CLIENTS, min_clients=CLIENTS, round_timeout_s=60,
                       train=TrainSpec(epochs=1, local_only_epochs=1), data=DataSpec(num_clients=CLIENTS))
    marks: dict[int, tuple[float, float]] = {}
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}

    async def main() -> None:
        store = MetaStore(work / f"fl-{'door' if door else 'direct'}-{index}.db")
        server = FlServer(config, store, tls=tls, tls_door=door, linger_s=2,
                          on_round=lambda o: marks.__setitem__(o.round, (time.process_time(), time.perf_counter())))
        port = await server.start()
        procs = [subprocess.Popen(["fl-client", "run", "--server", f"localhost:{port}", "--client-id", str(c),
                                   "--certs", str(files.directory), "-q"], env=env) for c in range(CLIENTS)]
        try:
            await server.serve(120)
        finally:
            await server.stop()
            for proc in procs:
                proc.wait(60)
            store.close()

    asyncio.run(main())
    span = rounds - 2
    return {"server_cpu_ms_per_round": (marks[rounds][0] - marks[2][0]) / span * 1000,
            "round_wall_ms": (marks[rounds][1] - marks[2][1]) / span * 1000}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=25)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="JSON file to write")
    args = parser.parse_args()
    if args.rounds < 4 or args.repeats < 1:
        parser.error("--rounds must be >= 4 and --repeats >= 1")
    single_threaded()
    runs: dict[str, list[dict]] = {"door": [], "direct": []}
    with tempfile.TemporaryDirectory(prefix="bench-tls-door-") as folder:
        work = Path(folder)
        files = issue_certs(work / "certs", client_ids=[str(c) for c in range(CLIENTS)])
        tls = ServerTls.from_files(files.server_cert, files.server_key, client_ca=files.ca)
        for i in range(args.repeats):
            for name in ("door", "direct"):
                runs[name].append(one_run(name == "door", args.rounds, work, files, tls, i))
                log(f"{name} run {i + 1}: {runs[name][-1]}")
    medians = {name: {key: statistics.median(r[key] for r in rs) for key in rs[0]} for name, rs in runs.items()}
    ratio = medians["door"]["server_cpu_ms_per_round"] / medians["direct"]["server_cpu_ms_per_round"]
    emit_table(make_table(f"mutual TLS, {CLIENTS} client processes, {args.rounds} rounds, median of {args.repeats}",
                          ["server", "server CPU ms/round", "round wall ms"],
                          [(name, f"{m['server_cpu_ms_per_round']:.2f}", f"{m['round_wall_ms']:.1f}")
                           for name, m in medians.items()]))
    log(f"door / direct server CPU: {ratio:.2f}x; load average {os.getloadavg()[0]:.1f}")
    result = {"rounds": args.rounds, "repeats": args.repeats, "clients": CLIENTS, "medians": medians,
              "door_over_direct_cpu": ratio, "runs": runs, "load_average_1m": os.getloadavg()[0]}
    if args.out is None:
        print(json.dumps(result))
        return
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
