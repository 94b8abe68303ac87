"""One round's timeline on both stacks (bench_fl_transport.py --timeline): monotonic marks from every process.

Run as a script, it is the launcher of one benchmark process: `python timeline.py ROLE OUT_DIR SCRIPT ARGS...`
wraps the steps of a round with marks (CLOCK_MONOTONIC, shared by all processes of the host, and the
process's CPU seconds) written to OUT_DIR/<pid>.tsv, then runs SCRIPT as __main__. Marked on both stacks:
the local training (train_local, the same function), a client's task arriving (decoded) and its update
leaving (written), and the server's round start and the arrival of each update. Benchmark-only: the product
carries no tracing; the wrapped functions are looked up by name, so a changed Flower fails here loudly.

`summarise(dir)` reads the marks: per round (rounds 3..R-1, from one round's start to the next), the median
time after the round's start at which the first and the last client had their task, the last client
started and ended its training, the server had the last update, and the next round started; and per
client and round the CPU spent in training (all of train_local), from training's end until its update is
written, and from then until its next training starts (waiting, the round's end, the next task).
"""
from __future__ import annotations

import contextlib
import functools
import os
import runpy
import statistics
import sys
import time
from pathlib import Path

# per stack: (the server's round start, a client's task in, the server's update in)
MARKS = {"ours": ("begin_round>", "c.decode<", "submit<"), "flower": ("s.fit_round>", "c.recv<", "s.fit<")}


def _install(role: str, out: Path) -> None:
    sink = (out / f"{os.getpid()}.tsv").open("a", buffering=1)

    def mark(name: str) -> None:
        sink.write(f"{time.monotonic():.6f}\t{role}\t{name}\t{time.process_time():.6f}\n")

    def wrap(owner, attr: str, name: str) -> None:
        fn = getattr(owner, attr)

        @functools.wraps(fn)
        def marked(*a, **k):
            mark(name + ">")
            try:
                return fn(*a, **k)
            finally:
                mark(name + "<")
        setattr(owner, attr, marked)

    from mlsyskit.tools.fl import training
    wrap(training, "train_local", "train")  # before the client script imports it by name
    if role.startswith("ours"):
        from mlsyskit.core import rpc_client
        from mlsyskit.tools.fl.coordinator import Coordinator
        wrap(rpc_client, "_decode_reply", "c.decode")
        wrap(Coordinator, "begin_round", "begin_round")
        wrap(Coordinator, "submit", "submit")
        send = rpc_client.BidiCall.send

        async def marked_send(self, payload):
            await send(self, payload)
            if isinstance(payload, dict) and "weights" in payload:
                mark("c.update<")
        rpc_client.BidiCall.send = marked_send
        return
    from flwr.compat.client import app
    from flwr.server import server
    from flwr.server.superlink.fleet.grpc_bidi.grpc_client_proxy import GrpcClientProxy
    wrap(server.Server, "fit_round", "s.fit_round")
    wrap(GrpcClientProxy, "fit", "s.fit")
    connection = app.grpc_connection

    @contextlib.contextmanager
    def marked_connection(*a, **k):
        with connection(*a, **k) as (receive, send, *rest):
            def marked_receive():
                message = receive()
                mark("c.recv<")
                return message

            def marked_send(message):
                send(message)
                mark("c.update<")
            yield (marked_receive, marked_send, *rest)
    app.grpc_connection = marked_connection


def launcher(python: str, role: str, out: Path, args: list[str]) -> list[str]:
    """The command line that runs `args` (a script, or an interpreter and its script) under the marks."""
    if args[0].endswith("python"):
        python, args = args[0], args[1:]
    return [python, str(Path(__file__).resolve()), role, str(out), *args]


def _rows(out: Path) -> list[tuple[float, str, str, float]]:
    rows = []
    for f in out.glob("*.tsv"):
        for line in f.read_text().splitlines():
            t, role, name, cpu = line.split("\t")
            rows.append((float(t), role, name, float(cpu)))
    return sorted(rows)


def summarise(out: Path, stack: str) -> dict[str, float]:
    """Medians in ms (see the module's docstring)."""
    start, task_in, update_in = MARKS[stack]
    rows = _rows(out)
    starts = [t for t, _, name, _ in rows if name == start]
    per: dict[str, list[float]] = {}
    for t0, t1 in zip(starts[2:], starts[3:], strict=False):
        inside = [r for r in rows if t0 <= r[0] < t1]

        def at(name: str, pick=max, inside=inside) -> float | None:
            times = [t for t, _, n, _ in inside if n == name]
            return pick(times) - t0 if times else None  # noqa: B023 (t0 of this round, used at once)
        steps = {"first client has its task": at(task_in, min), "last client has its task": at(task_in),
                 "last training starts": at("train>"), "last training ends": at("train<"),
                 "server has the last update": at(update_in), "next round starts": t1 - t0}
        for k, v in steps.items():
            if v is not None:
                per.setdefault(k, []).append(1e3 * v)
    for role in sorted({r for _, r, _, _ in rows if "client" in r}):
        marks = [(n, c) for _, r, n, c in rows if r == role]
        begins = [i for i, (n, _) in enumerate(marks) if n == "train>"]
        for a, b in zip(begins[2:], begins[3:], strict=False):
            span = marks[a:b + 1]
            ended = next((c for n, c in span if n == "train<"), None)
            sent = next((c for n, c in span if n == "c.update<"), None)
            if ended is None or sent is None:
                continue
            for k, v in (("client CPU: train_local", ended - span[0][1]), ("client CPU: update out", sent - ended),
                         ("client CPU: waiting, round end, next task in", span[-1][1] - sent)):
                per.setdefault(k, []).append(1e3 * v)
    return {k: statistics.median(v) for k, v in per.items()}


def our_breakdown(events: list[dict]) -> dict[str, float]:
    """Where our round goes, medians over rounds 2..R in seconds, from fl-server's events (each update
    carries the client's own local_s, task in to update out, and train_time_s; the server adds received_s,
    task out to update in): the server's gap between rounds (round-end messages, selection, dispatch),
    and for the client whose update came last: its training, its work outside training (decode, model
    load, test accuracy, encode), the transport both ways (received_s - local_s: gRPC, serialisation
    and waiting for a core), the server's wait for it after it arrived, and the round's close (aggregate,
    evaluate, commit)."""
    starts = {e["round"]: e["t"] for e in events if e["kind"] == "round_start"}
    ends = {e["round"]: e for e in events if e["kind"] == "round_end"}
    rows = []
    for r in range(2, max(ends) + 1):
        e = ends[r]
        last = max((c["metrics"] for c in e["reports"].values()), key=lambda m: m.get("received_s", 0.0))
        rows.append({"server_between_rounds_s": starts[r] - ends[r - 1]["t"],
                     "last_client_training_s": last["train_time_s"],
                     "last_client_outside_training_s": last["local_s"] - last["train_time_s"],
                     "transport_both_ways_s": last["received_s"] - last["local_s"],
                     "server_after_last_update_s": e["phases"]["collect_s"] - last["received_s"],
                     "close_round_s": e["t"] - starts[r] - e["phases"]["collect_s"]})
    return {k: statistics.median(row[k] for row in rows) for k in rows[0]}


if __name__ == "__main__":
    _role, _out, *_args = sys.argv[1:]
    _install(_role, Path(_out))
    sys.argv = _args
    runpy.run_path(_args[0], run_name="__main__")
