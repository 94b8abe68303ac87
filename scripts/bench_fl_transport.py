#!/usr/bin/env python
"""FL transport benchmark: our fl-server/fl-client versus Flower on the same workload.

10 real client processes on loopback, digits MLP (Dirichlet 0.5 partition, seed 0), FedAvg with
all 10 clients every round, 20 rounds, central evaluation on the same global test set each round,
and the same local-training function on both sides. Flower (flwr, legacy gRPC server/client API)
runs in its own venv, created here under .bench-venvs/flwr with `pip install flwr`; that venv
also sees mlsyskit's venv (a .pth line) for the shared data/model/training code.

Each workload runs with 5 local epochs (fl-client's default) and with 2 (less compute per round,
so orchestration overhead weighs more). Targets (issue 4), checked per workload on measured
medians over --repeats and recorded with `met`:
- rounds per second over rounds 2..20 (19 / (end of round 20 - end of round 1)) >= 2x Flower's;
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
        server.wait(timeout=600)
        if server.returncode != 0:
            raise RuntimeError(f"server failed ({server.returncode}); see {work / 'server.log'}")
        start, end, accuracy = marks(work)
        rounds = max(end)
        # round 1 also waits for the clients to start (Flower starts its clock before they join), so
        # throughput is measured over rounds 2..R, from the end of one round to the end of the next
        gaps = [end[r] - end[r - 1] for r in range(2, rounds + 1)]
        return {"startup_s": listening - spawned, "round1_done_after_spawn_s": end[1] - spawned,
                "rounds": rounds, "rounds_per_s": len(gaps) / sum(gaps), "median_round_s": statistics.median(gaps),
                "final_accuracy": accuracy}
    finally:
        stop(procs)


def ours(args, epochs: int, work: Path) -> dict:
    run_dir = work / "run"
    (work / "job.toml").write_text(f"[train]\nepochs = {epochs}\n")
    server = ["fl-server", "run", "--config", str(work / "job.toml"), "--strategy", "fedavg", "--dataset", "digits",
              "--clients", str(args.clients),
              "--per-round", str(args.clients), "--rounds", str(args.rounds), "--address", "127.0.0.1:{port}",
              "--run-dir", str(run_dir), "--round-timeout", "60", "--registration-timeout", "120"]
    client = ["fl-client", "run", "--server", "127.0.0.1:{port}", "--client-id", "{cid}", "--dataset", "digits"]

    def marks(_work):
        events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
        start = {e["round"]: e["t"] for e in events if e["kind"] == "round_start"}
        end = {e["round"]: e["t"] for e in events if e["kind"] == "round_end"}
        acc = [e["global"]["accuracy"] for e in events if e["kind"] == "round_end"][-1]
        # what local training alone costs per round: client CPU seconds spread over the cores
        floors = [sum(r["metrics"]["cpu_time_s"] for r in e["reports"].values()) / os.cpu_count()
                  for e in events if e["kind"] == "round_end" and e["round"] > 1]
        compute_floor.append(statistics.median(floors))
        return start, end, acc

    compute_floor: list[float] = []
    result = measure(server, client, args.clients, work, marks)
    return result | {"training_cpu_per_core_s": compute_floor[0]}


def flower(args, python: Path, epochs: int, work: Path) -> dict:
    out = work / "flower.json"
    server = [str(python), str(FLOWER_DIR / "server.py"), "127.0.0.1:{port}", str(args.clients), str(args.rounds),
              str(out)]
    client = [str(python), str(FLOWER_DIR / "client.py"), "127.0.0.1:{port}", str(args.clients), "{cid}",
              str(epochs)]

    def marks(_work):
        data = json.loads(out.read_text())
        return ({int(k): v for k, v in data["start"].items()}, {int(k): v for k, v in data["end"].items()},
                data["accuracy"])

    return measure(server, client, args.clients, work, marks)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=10)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--epochs", type=int, nargs="+", default=[5, 2], help="local epochs (5 = fl-client's default)")
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
                for name in ("ours", "flower"):
                    work = Path(tmp) / f"{name}-{epochs}-{repeat}"
                    work.mkdir()
                    r = ours(args, epochs, work) if name == "ours" else flower(args, python, epochs, work)
                    results[str(epochs)][name].append(r)
                    log(f"{epochs} epochs, {name} #{repeat}: {r['rounds_per_s']:.2f} rounds/s, "
                        f"start-up {r['startup_s']:.2f}s, accuracy {r['final_accuracy']:.3f}")

    keys = ("rounds_per_s", "median_round_s", "startup_s", "round1_done_after_spawn_s", "final_accuracy")
    summary: dict[str, dict] = {}
    targets: dict[str, dict] = {}
    rows = []
    for epochs, by_stack in results.items():
        summary[epochs] = {name: {k: statistics.median(r[k] for r in runs) for k in keys}
                           for name, runs in by_stack.items()}
        summary[epochs]["ours"]["training_cpu_per_core_s"] = statistics.median(
            r["training_cpu_per_core_s"] for r in by_stack["ours"])
        speedup = summary[epochs]["ours"]["rounds_per_s"] / summary[epochs]["flower"]["rounds_per_s"]
        startup = summary[epochs]["ours"]["startup_s"]
        targets[f"rounds_per_s_vs_flower@{epochs}ep"] = {"measured": speedup, "target": ">= 2.0", "met": speedup >= 2.0}
        targets[f"server_startup_s@{epochs}ep"] = {"measured": startup, "target": "< 2.0", "met": startup < 2.0}
        rows += [(f"{name} ({epochs} ep)", *(s[k] for k in keys)) for name, s in summary[epochs].items()]
    emit_table(make_table(f"FL transport: {args.clients} clients, {args.rounds} rounds, median of {args.repeats}",
                          ["stack", "rounds/s", "round s", "start-up s", "round 1 done s", "accuracy"], rows))
    emit_table(make_table("targets", ["target", "measured", "want", "met"],
                          [(k, v["measured"], v["target"], v["met"]) for k, v in targets.items()]))
    flwr_version = subprocess.run([str(python), "-c", "import flwr; print(flwr.__version__)"], capture_output=True,
                                  text=True).stdout.strip()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"config": {k: str(v) for k, v in vars(args).items()}, "flwr": flwr_version,
                                    "summary": summary, "targets": targets, "runs": results}, indent=2))
    log(f"wrote {args.out}")
    return 0 if all(t["met"] for t in targets.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
