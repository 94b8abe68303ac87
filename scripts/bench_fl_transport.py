#!/usr/bin/env python
"""FL transport benchmark: our fl-server/fl-client versus Flower on the same workload.

10 real client processes on loopback, digits MLP (Dirichlet 0.5 partition, seed 0), FedAvg with
all 10 clients every round, 20 rounds, central evaluation on the same global test set each round,
and the same local-training function on both sides. Flower (flwr, legacy gRPC server/client API)
runs in its own venv, created here under .bench-venvs/flwr with `pip install flwr`; that venv
also sees mlsyskit's venv (a .pth line) for the shared data/model/training code.

Each workload runs with 1, 2 and 5 local epochs (5 = fl-client's default; fewer epochs mean less
compute per round, so orchestration overhead weighs more). Per run it also records CPU seconds per
round of the server and of all clients (psutil, sampled every 0.1 s), the clients' own training CPU
(the CPU of train_local's epochs, its cpu_time_s, reported by both stacks) and the server's wall time per phase
(collect, aggregate, evaluate, and commit for ours). Targets (issue 4), checked per workload on
measured medians over --repeats and recorded with `met`:
- rounds per second over rounds 2..20 (19 / (end of round 20 - end of round 1)) >= 2x Flower's,
  next to the ceiling a zero-overhead stack would reach (Flower's round / (training CPU / cores));
- server start-up (spawn to accepting connections) under 2 s.

    .venv/bin/python scripts/bench_fl_transport.py --out runs/bench_fl_transport.json
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import psutil

from mlsyskit.core.console import emit_table, log, make_table

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
FLOWER_DIR = Path(__file__).resolve().parent / "bench_fl_flower"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, proc: subprocess.Popen, timeout: float = 120.0) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before listening")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return time.monotonic()
        except OSError:
            time.sleep(0.005)
    raise TimeoutError(f"nothing listened on {port} within {timeout}s")


def sample_cpu(server: subprocess.Popen, clients: list[subprocess.Popen], timeout: float,
               every: float = 0.1) -> list[tuple[float, float, float]]:
    """(time, server CPU s, all clients' CPU s) every `every` s until the server exits: with every
    process pinned to the same two cores, CPU seconds per round is the noise-robust cost measure."""
    handles = [psutil.Process(p.pid) for p in (server, *clients)]
    last = [0.0] * len(handles)
    samples = []
    deadline = time.monotonic() + timeout
    while server.poll() is None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the server did not finish within {timeout:g}s")
        for i, h in enumerate(handles):
            try:
                t = h.cpu_times()
                last[i] = t.user + t.system
            except psutil.Error:  # exited: keep its last reading
                pass
        samples.append((time.monotonic(), last[0], sum(last[1:])))
        time.sleep(every)
    return samples


def cpu_between(samples: list[tuple[float, float, float]], column: int, t0: float, t1: float) -> float:
    """CPU seconds spent between t0 and t1 (linear between samples)."""
    def at(t: float) -> float:
        for (ta, *a), (tb, *b) in zip(samples, samples[1:], strict=False):
            if ta <= t <= tb:
                return a[column - 1] + (b[column - 1] - a[column - 1]) * (t - ta) / max(tb - ta, 1e-9)
        return samples[-1][column] if t > samples[-1][0] else samples[0][column]
    return at(t1) - at(t0)


def ensure_flower_venv(venv: Path) -> Path:
    python = venv / "bin" / "python"
    if not python.exists():
        log(f"creating {venv} and installing flwr (one time)")
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "flwr"], check=True)
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    ours = sysconfig.get_paths()["purelib"]
    (site / "mlsyskit-host.pth").write_text(f"import site; site.addsitedir({ours!r})\n")
    check = subprocess.run([str(python), "-c", "import flwr, mlsyskit.tools.fl.training; print(flwr.__version__)"],
                           capture_output=True, text=True)
    if check.returncode != 0:
        raise RuntimeError(f"the Flower venv cannot import flwr and mlsyskit: {check.stderr.strip()[-500:]}")
    log(f"flwr {check.stdout.strip()} in {venv}")
    return python


def stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
    for p in procs:
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def spawn(args: list[str], log_path: Path) -> subprocess.Popen:
    env = {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    with log_path.open("w") as f:
        return subprocess.Popen(args, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=REPO, start_new_session=True)


def measure(server_args: list[str], client_args, clients: int, work: Path, marks) -> dict:
    port = free_port()
    procs: list[subprocess.Popen] = []
    try:
        spawned = time.monotonic()
        server = spawn([a.format(port=port) for a in server_args], work / "server.log")
        procs.append(server)
        listening = wait_for_port(port, server)
        for cid in range(clients):
            procs.append(spawn([a.format(port=port, cid=cid) for a in client_args], work / f"client{cid}.log"))
        samples = sample_cpu(server, procs[1:], timeout=600)
        if server.returncode != 0:
            raise RuntimeError(f"server failed ({server.returncode}); see {work / 'server.log'}")
        start, end, accuracy, phases, training_cpu = marks(work)
        rounds = max(end)
        # round 1 also waits for the clients to start (Flower starts its clock before they join), so
        # throughput is measured over rounds 2..R, from the end of one round to the end of the next
        gaps = [end[r] - end[r - 1] for r in range(2, rounds + 1)]
        server_cpu, clients_cpu = (cpu_between(samples, i, end[1], end[rounds]) / (rounds - 1) for i in (1, 2))
        later = range(2, rounds + 1)
        phase_medians = {f"{k}": statistics.median(phases[r][k] for r in later) for k in phases[rounds]}
        return {"server_cpu_per_round_s": server_cpu, "clients_cpu_per_round_s": clients_cpu,
                "training_cpu_per_round_s": statistics.median(training_cpu[r] for r in later),
                "phases": phase_medians, "startup_s": listening - spawned, "round1_done_after_spawn_s": end[1] - spawned,
                "rounds": rounds, "rounds_per_s": len(gaps) / sum(gaps), "median_round_s": statistics.median(gaps),
                "final_accuracy": accuracy}
    finally:
        stop(procs)


def ours(args, epochs: int, work: Path) -> dict:
    run_dir = work / "run"
    (work / "job.toml").write_text(f"[train]\nepochs = {epochs}\n")
    server = ["fl-server", "run", "--config", str(work / "job.toml"), "--strategy", "fedavg", "--dataset", "digits",
              "--clients", str(args.clients),
              "--per-round", str(args.clients), "--min-clients", str(args.clients), "--rounds", str(args.rounds), "--address", "127.0.0.1:{port}",
              "--run-dir", str(run_dir), "--round-timeout", "60", "--registration-timeout", "120"]
    client = ["fl-client", "run", "--server", "127.0.0.1:{port}", "--client-id", "{cid}", "--dataset", "digits"]

    def marks(_work):
        events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
        start = {e["round"]: e["t"] for e in events if e["kind"] == "round_start"}
        ends = {e["round"]: e for e in events if e["kind"] == "round_end"}
        end = {r: e["t"] for r, e in ends.items()}
        acc = ends[max(ends)]["global"]["accuracy"]
        # what local training alone costs per round (train_local's measured CPU, summed over clients)
        training = {r: sum(c["metrics"]["cpu_time_s"] for c in e["reports"].values()) for r, e in ends.items()}
        return start, end, acc, {r: e["phases"] for r, e in ends.items()}, training

    return measure(server, client, args.clients, work, marks)


def flower(args, python: Path, epochs: int, work: Path) -> dict:
    out = work / "flower.json"
    server = [str(python), str(FLOWER_DIR / "server.py"), "127.0.0.1:{port}", str(args.clients), str(args.rounds),
              str(out)]
    client = [str(python), str(FLOWER_DIR / "client.py"), "127.0.0.1:{port}", str(args.clients), "{cid}",
              str(epochs)]

    def marks(_work):
        data = json.loads(out.read_text())
        def by_round(d: dict) -> dict:
            return {int(k): v for k, v in d.items()}
        return (by_round(data["start"]), by_round(data["end"]), data["accuracy"], by_round(data["phases"]),
                by_round(data["training_cpu"]))

    return measure(server, client, args.clients, work, marks)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=10)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--epochs", type=int, nargs="+", default=[1, 2, 5],
                   help="local epochs (5 = fl-client's default)")
    p.add_argument("--stacks", nargs="+", choices=["ours", "flower"], default=["ours", "flower"],
                   help="which stacks to run (both for the targets)")
    p.add_argument("--venv", type=Path, default=REPO / ".bench-venvs" / "flwr")
    p.add_argument("--out", type=Path, default=Path("runs/bench_fl_transport.json"))
    args = p.parse_args()

    try:
        python = ensure_flower_venv(args.venv)
    except (subprocess.CalledProcessError, RuntimeError) as e:
        log(f"[red]cannot set up Flower: {e}[/]")
        return 2
    results: dict[str, dict[str, list[dict]]] = {str(e): {"ours": [], "flower": []} for e in args.epochs}
    with tempfile.TemporaryDirectory(prefix="bench-fl-") as tmp:
        for epochs in args.epochs:
            for repeat in range(args.repeats):  # alternate, so load on the shared machine hits both alike
                for name in args.stacks:
                    work = Path(tmp) / f"{name}-{epochs}-{repeat}"
                    work.mkdir()
                    r = ours(args, epochs, work) if name == "ours" else flower(args, python, epochs, work)
                    results[str(epochs)][name].append(r)
                    log(f"{epochs} epochs, {name} #{repeat}: {r['rounds_per_s']:.2f} rounds/s, "
                        f"start-up {r['startup_s']:.2f}s, accuracy {r['final_accuracy']:.3f}")

    keys = ("rounds_per_s", "median_round_s", "startup_s", "round1_done_after_spawn_s", "final_accuracy",
            "server_cpu_per_round_s", "clients_cpu_per_round_s", "training_cpu_per_round_s")
    summary: dict[str, dict] = {}
    targets: dict[str, dict] = {}
    rows, phase_rows = [], []
    cores = os.cpu_count() or 1
    for epochs, by_stack in results.items():
        summary[epochs] = {}
        for name, runs in by_stack.items():
            if not runs:
                continue
            s = {k: statistics.median(r[k] for r in runs) for k in keys}
            s["phases"] = {k: statistics.median(r["phases"][k] for r in runs) for k in runs[0]["phases"]}
            s["clients_other_cpu_per_round_s"] = s["clients_cpu_per_round_s"] - s["training_cpu_per_round_s"]
            summary[epochs][name] = s
            rows.append((f"{name} ({epochs} ep)", s["rounds_per_s"], 1e3 * s["median_round_s"], s["startup_s"],
                         s["round1_done_after_spawn_s"], s["final_accuracy"]))
            ms = {k: 1e3 * v for k, v in s["phases"].items()}
            phase_rows.append((f"{name} ({epochs} ep)", ms["collect_s"], ms["aggregate_s"], ms["evaluate_s"],
                               ms.get("commit_s", 0.0), 1e3 * s["training_cpu_per_round_s"],
                               1e3 * s["clients_other_cpu_per_round_s"], 1e3 * s["server_cpu_per_round_s"]))
        if set(summary[epochs]) != {"ours", "flower"}:
            continue
        ours_s, flower_s = summary[epochs]["ours"], summary[epochs]["flower"]
        speedup = ours_s["rounds_per_s"] / flower_s["rounds_per_s"]
        # the best any stack could do: the clients' training CPU alone, perfectly packed on the cores
        floor_round_s = statistics.median([ours_s["training_cpu_per_round_s"],
                                           flower_s["training_cpu_per_round_s"]]) / cores
        summary[epochs]["training_floor_round_s"] = floor_round_s
        summary[epochs]["ratio_ceiling"] = flower_s["median_round_s"] / floor_round_s
        targets[f"rounds_per_s_vs_flower@{epochs}ep"] = {
            "measured": speedup, "target": ">= 2.0", "met": speedup >= 2.0,
            "ceiling_with_zero_overhead": summary[epochs]["ratio_ceiling"]}
        startup = ours_s["startup_s"]
        targets[f"server_startup_s@{epochs}ep"] = {"measured": startup, "target": "< 2.0", "met": startup < 2.0}
    emit_table(make_table(f"FL transport: {args.clients} clients, {args.rounds} rounds, median of {args.repeats}",
                          ["stack", "rounds/s", "round ms", "start-up s", "round 1 done s", "accuracy"], rows))
    emit_table(make_table(f"one round (rounds 2-{args.rounds}, medians): wall ms per server phase, CPU ms per round",
                          ["stack", "collect", "aggregate", "evaluate", "commit", "training CPU",
                           "clients' other CPU", "server CPU"], phase_rows))
    emit_table(make_table("targets", ["target", "measured", "want", "met", "ceiling (zero overhead)"],
                          [(k, v["measured"], v["target"], v["met"], v.get("ceiling_with_zero_overhead", "-"))
                           for k, v in targets.items()]))
    flwr_version = subprocess.run([str(python), "-c", "import flwr; print(flwr.__version__)"], capture_output=True,
                                  text=True).stdout.strip()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"config": {k: str(v) for k, v in vars(args).items()}, "flwr": flwr_version,
                                    "summary": summary, "targets": targets, "runs": results}, indent=2))
    log(f"wrote {args.out}")
    return 0 if targets and all(t["met"] for t in targets.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
