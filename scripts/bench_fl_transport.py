#!/usr/bin/env python
"""FL transport benchmark: our fl-server/fl-client versus Flower 1.42 on the same workload.

10 real client processes on loopback, each reading its own folder that `fl-server partition` wrote
(digits, Dirichlet 0.5, seed 0), the digits MLP, FedAvg with all 10 clients every round, central
evaluation of the global model on the server's test set each round, and the same local-training
function (tools/fl/training.py train_local) on both sides. Flower runs in its own venv
(.bench-venvs/flwr, flwr==1.42.0 installed by this script once; that venv sees mlsyskit's venv
through a .pth line for the shared data, model and training code); nothing is downloaded by the
product.

For each of --epochs (default 1, 5, 10 local epochs), --repeats runs of each stack alternate (the
order flips every repeat, so the shared machine's load hits both alike). Per round r (rounds 2..R;
round 1 also waits for the clients to start) it records
  wall      end of round r - end of round r-1 (the whole cycle: dispatch, training, collection,
            aggregation, evaluation, commit, the next round's start),
  slowest   the longest train_time_s (train_local's wall time of the local epochs) of the
            round's clients, and
  overhead  wall - slowest: serialisation, transport, aggregation, evaluation and waiting.
Per run also: CPU seconds per round of the server and of all clients (psutil, every 0.1 s), the
clients' training CPU and the server's wall time per phase. Targets (issue 21 item 4), on the
medians over all measured rounds of all repeats: our overhead <= 0.5x Flower's at every epoch
count; rounds/s >= 1.5x Flower's at 1 epoch and >= 1.0x at every epoch count.
`--profile DIR` also runs the server and client 0 of each stack's first run under py-spy
(from the Flower venv) and writes where their non-training time goes. `--timeline DIR` runs each
stack once more with every process marking a round's steps on the host's monotonic clock
(flbench/timeline.py): when the clients get their tasks, train and answer, and where their CPU goes.

    .venv/bin/python scripts/bench_fl_transport.py --repeats 3 --out docs/results/bench_fl_transport.json
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
from mlsyskit.core.net import free_port
from mlsyskit.tools.fl.config import DataSpec
from mlsyskit.tools.fl.partition import write_partition

sys.path.insert(0, str(Path(__file__).resolve().parent))  # scripts/flbench
from flbench import timeline  # noqa: E402
from flbench.profile_summary import where_time_goes  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
FLOWER_DIR = Path(__file__).resolve().parent / "bench_fl_flower"
FLWR = "1.42.0"
PY_SPY = REPO / ".bench-venvs" / "flwr" / "bin" / "py-spy"  # installed with flwr (--profile)
TIMELINE: tuple[str, Path] | None = None  # (stack, folder): the run in progress leaves its marks there (--timeline)


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
        subprocess.run([str(python), "-m", "pip", "install", "-q", f"flwr=={FLWR}", "py-spy"], check=True)
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
    if TIMELINE is not None:
        args = timeline.launcher(sys.executable, f"{TIMELINE[0]}-{log_path.stem}", TIMELINE[1], args)
    env = {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    with log_path.open("w") as f:
        return subprocess.Popen(args, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=REPO, start_new_session=True)


def measure(server_args: list[str], client_args, clients: int, work: Path, marks, profile: Path | None) -> dict:
    port = free_port()
    procs: list[subprocess.Popen] = []
    try:
        spawned = time.monotonic()
        server = spawn(_profiled([a.format(port=port) for a in server_args], profile, "server"), work / "server.log")
        procs.append(server)
        listening = wait_for_port(port, server)
        for cid in range(clients):
            args = [a.format(port=port, cid=cid) for a in client_args]
            procs.append(spawn(_profiled(args, profile if cid == 0 else None, "client0"), work / f"client{cid}.log"))
        samples = sample_cpu(server, procs[1:], timeout=900)
        if server.returncode != 0:
            raise RuntimeError(f"server failed ({server.returncode}); see {work / 'server.log'}")
        if profile is not None:  # py-spy writes its profile when its client ends or it is interrupted
            os.kill(procs[1].pid, signal.SIGINT)
            procs[1].wait(60)
        end, accuracy, phases, training_cpu, train_time = marks(work)
        rounds = max(end)
        later = range(2, rounds + 1)
        # round 1 also waits for the clients to start (Flower starts its clock before they join), so
        # rounds are measured from 2 on, from the end of one round to the end of the next
        per_round = [{"round": r, "wall_s": end[r] - end[r - 1], "slowest_train_s": max(train_time[r]),
                      "overhead_s": end[r] - end[r - 1] - max(train_time[r])} for r in later]
        server_cpu, clients_cpu = (cpu_between(samples, i, end[1], end[rounds]) / (rounds - 1) for i in (1, 2))
        phase_medians = {k: statistics.median(phases[r][k] for r in later) for k in phases[rounds]}
        return {"server_cpu_per_round_s": server_cpu, "clients_cpu_per_round_s": clients_cpu,
                "training_cpu_per_round_s": statistics.median(training_cpu[r] for r in later),
                "phases": phase_medians, "startup_s": listening - spawned, "round1_done_after_spawn_s": end[1] - spawned,
                "rounds": rounds, "rounds_per_s": (rounds - 1) / (end[rounds] - end[1]), "per_round": per_round,
                "final_accuracy": accuracy, "loadavg": os.getloadavg()}
    finally:
        stop(procs)


def _profiled(args: list[str], profile: Path | None, name: str) -> list[str]:
    if profile is None:
        return args
    return [str(PY_SPY), "record", "--rate", "250", "--function", "--gil", "--format", "raw",
            "--output",
            str(profile / f"{name}.txt"), "--", *args]


def ours(args, epochs: int, work: Path, fed: Path, profile: Path | None) -> dict:
    run_dir = work / "run"
    (work / "job.toml").write_text(f"[train]\nepochs = {epochs}\n")
    venv = [] if profile is None else [sys.executable]  # py-spy needs the interpreter, not the entry-point script
    server = [*venv, str(VENV_BIN / "fl-server"), "run", "--config", str(work / "job.toml"), "--strategy", "fedavg",
              "--validation", str(fed / "server"), "--clients", str(args.clients), "--per-round", str(args.clients),
              "--min-clients", str(args.clients), "--rounds", str(args.rounds), "--address", "127.0.0.1:{port}",
              "--run-dir", str(run_dir), "--round-timeout", "60", "--registration-timeout", "120"]
    client = [*venv, str(VENV_BIN / "fl-client"), "run", "--server", "127.0.0.1:{port}", "--client-id", "{cid}",
              "--data", str(fed / "client-{cid}")]

    def marks(_work):
        events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
        ends = {e["round"]: e for e in events if e["kind"] == "round_end"}
        end = {r: e["t"] for r, e in ends.items()}
        acc = ends[max(ends)]["global"]["accuracy"]
        # what local training alone costs per round (train_local's measured CPU, summed over clients)
        training = {r: sum(c["metrics"]["cpu_time_s"] for c in e["reports"].values()) for r, e in ends.items()}
        train_time = {r: [c["metrics"]["train_time_s"] for c in e["reports"].values()] for r, e in ends.items()}
        phases = {r: e["phases"] | {f"ours:{k}": v for k, v in timeline.our_breakdown(events).items()}
                  for r, e in ends.items()}
        return end, acc, phases, training, train_time

    return measure(server, client, args.clients, work, marks, profile)


def flower(args, python: Path, epochs: int, work: Path, fed: Path, task: dict, profile: Path | None) -> dict:
    out = work / "flower.json"
    server = [str(python), str(FLOWER_DIR / "server.py"), "127.0.0.1:{port}", str(fed / "server"), str(args.clients),
              str(args.rounds), str(out)]
    client = [str(python), str(FLOWER_DIR / "client.py"), "127.0.0.1:{port}", str(fed / "client-{cid}"), "{cid}",
              str(epochs), str(task["num_features"]), str(task["num_classes"]), str(fed / "server")]

    def marks(_work):
        data = json.loads(out.read_text())

        def by_round(d: dict) -> dict:
            return {int(k): v for k, v in d.items()}
        return (by_round(data["end"]), data["accuracy"], by_round(data["phases"]), by_round(data["training_cpu"]),
                by_round(data["train_time"]))

    return measure(server, client, args.clients, work, marks, profile)


def summarise(runs: list[dict]) -> dict:
    keys = ("rounds_per_s", "startup_s", "round1_done_after_spawn_s", "final_accuracy", "server_cpu_per_round_s",
            "clients_cpu_per_round_s", "training_cpu_per_round_s")
    s = {k: statistics.median(r[k] for r in runs) for k in keys}
    rounds = [row for r in runs for row in r["per_round"]]
    for k in ("wall_s", "slowest_train_s", "overhead_s"):
        s[f"round_{k}"] = statistics.median(row[k] for row in rounds)
    s["phases"] = {k: statistics.median(r["phases"][k] for r in runs) for k in runs[0]["phases"]}
    s["clients_other_cpu_per_round_s"] = s["clients_cpu_per_round_s"] - s["training_cpu_per_round_s"]
    return s


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=10)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--epochs", type=int, nargs="+", default=[1, 5, 10], help="local epochs (5 = fl-client's default)")
    p.add_argument("--stacks", nargs="+", choices=["ours", "flower"], default=["ours", "flower"],
                   help="which stacks to run (both for the targets)")
    p.add_argument("--venv", type=Path, default=REPO / ".bench-venvs" / "flwr")
    p.add_argument("--profile", type=Path, default=None,
                   help="also profile each stack's server and client 0 (py-spy, one extra run per stack and epoch "
                        "count, not timed) and write the raw stacks and where the time goes here")
    p.add_argument("--out", type=Path, default=Path("runs/bench_fl_transport.json"))
    p.add_argument("--profile-epochs", type=int, nargs="+", default=None,
                   help="the epoch counts to profile (default: the first of --epochs)")
    p.add_argument("--work", type=Path, default=None, help="keep the runs' folders (logs, run dirs) here")
    p.add_argument("--timeline", type=Path, default=None,
                   help="also run each stack once more (not timed) with every process marking a round's steps "
                        "(flbench/timeline.py) and write the marks here; the medians go into the table and JSON")
    args = p.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the servers and clients on the way out

    global PY_SPY
    PY_SPY = args.venv / "bin" / "py-spy"
    try:
        python = ensure_flower_venv(args.venv)
    except (subprocess.CalledProcessError, RuntimeError) as e:
        log(f"[red]cannot set up Flower: {e}[/]")
        return 2
    results: dict[str, dict[str, list[dict]]] = {str(e): {"ours": [], "flower": []} for e in args.epochs}
    profiles: dict[str, dict] = {}
    timelines: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="bench-fl-") as scratch:
        tmp = args.work or scratch
        fed = Path(tmp) / "fed"
        task = write_partition(DataSpec(dataset="digits", num_clients=args.clients, alpha=0.5, seed=0), fed)
        for i, epochs in enumerate(args.epochs):
            for repeat in range(args.repeats):  # alternate, flipping the order, so load hits both alike
                order = args.stacks if (i + repeat) % 2 == 0 else list(reversed(args.stacks))
                for name in order:
                    r = run_one(args, python, name, epochs, Path(tmp) / f"{name}-{epochs}-{repeat}", fed, task, None)
                    results[str(epochs)][name].append(r)
                    log(f"{epochs} epochs, {name} #{repeat}: {r['rounds_per_s']:.2f} rounds/s, overhead "
                        f"{1e3 * statistics.median(x['overhead_s'] for x in r['per_round']):.1f} ms/round, "
                        f"load {r['loadavg'][0]:.1f}")
            if args.timeline is not None and i == 0:
                timelines[str(epochs)] = traced_runs(args, python, epochs, Path(tmp), fed, task)
            if args.profile is not None and epochs in (args.profile_epochs or args.epochs[:1]):
                for name in args.stacks:
                    out = args.profile / f"{name}-{epochs}ep"
                    out.mkdir(parents=True, exist_ok=True)
                    run_one(args, python, name, epochs, Path(tmp) / f"{name}-{epochs}-profile", fed, task, out)
                    profiles[f"{name}@{epochs}ep"] = {f.stem: where_time_goes(f) for f in sorted(out.glob("*.txt"))}
    return report(args, python, results, profiles, timelines)


def traced_runs(args, python: Path, epochs: int, tmp: Path, fed: Path, task: dict) -> dict[str, dict[str, float]]:
    """Each stack once more with every process marking a round's steps: where the round's time goes."""
    global TIMELINE
    found = {}
    for name in args.stacks:
        marks = args.timeline / f"{name}-{epochs}ep"
        marks.mkdir(parents=True, exist_ok=True)
        TIMELINE = (name, marks)
        try:
            run_one(args, python, name, epochs, tmp / f"{name}-{epochs}-timeline", fed, task, None)
        finally:
            TIMELINE = None
        found[name] = timeline.summarise(marks, name)
    return found


def run_one(args, python: Path, name: str, epochs: int, work: Path, fed: Path, task: dict,
            profile: Path | None) -> dict:
    work.mkdir()
    if name == "ours":
        return ours(args, epochs, work, fed, profile)
    return flower(args, python, epochs, work, fed, task, profile)


def _median_overhead(run: dict) -> float:
    return statistics.median(row["overhead_s"] for row in run["per_round"])


def report(args, python: Path, results: dict, profiles: dict, timelines: dict) -> int:
    summary: dict[str, dict] = {}
    targets: dict[str, dict] = {}
    rows, cpu_rows = [], []
    for epochs, by_stack in results.items():
        summary[epochs] = {name: summarise(runs) for name, runs in by_stack.items() if runs}
        for name, s in summary[epochs].items():
            rows.append((f"{name} ({epochs} ep)", s["rounds_per_s"], 1e3 * s["round_wall_s"],
                         1e3 * s["round_slowest_train_s"], 1e3 * s["round_overhead_s"], s["final_accuracy"]))
            cpu_rows.append((f"{name} ({epochs} ep)", 1e3 * s["training_cpu_per_round_s"],
                             1e3 * s["clients_other_cpu_per_round_s"], 1e3 * s["server_cpu_per_round_s"],
                             *(1e3 * s["phases"].get(k, 0.0) for k in ("collect_s", "aggregate_s", "evaluate_s",
                                                                        "commit_s"))))
        if set(summary[epochs]) != {"ours", "flower"}:
            continue
        o, f = summary[epochs]["ours"], summary[epochs]["flower"]
        speed = o["rounds_per_s"] / f["rounds_per_s"]
        overhead = o["round_overhead_s"] / f["round_overhead_s"]
        pairs = [a["rounds_per_s"] / b["rounds_per_s"] for a, b in zip(results[epochs]["ours"],
                                                                        results[epochs]["flower"], strict=False)]
        want = 1.5 if epochs == "1" else 1.0
        targets[f"rounds_per_s_vs_flower@{epochs}ep"] = {"measured": speed, "target": f">= {want}",
                                                         "met": speed >= want, "per_repeat": pairs}
        overhead_pairs = [_median_overhead(a) / _median_overhead(b) for a, b in zip(
            results[epochs]["ours"], results[epochs]["flower"], strict=False)]
        targets[f"overhead_vs_flower@{epochs}ep"] = {"measured": overhead, "target": "<= 0.5", "met": overhead <= 0.5,
                                                     "per_repeat": overhead_pairs}
    emit_table(make_table(f"FL transport: {args.clients} clients, {args.rounds} rounds, {args.repeats} alternated "
                          "repeats; per round, medians over rounds 2..R of all repeats (ms)",
                          ["stack", "rounds/s", "wall", "slowest client's training", "overhead", "accuracy"], rows))
    emit_table(make_table("CPU ms per round (all clients / server) and the server's wall ms per phase",
                          ["stack", "training CPU", "clients' other CPU", "server CPU", "collect", "aggregate",
                           "evaluate", "commit"], cpu_rows))
    emit_table(make_table("targets (on the medians; per alternated pair after)", ["target", "measured", "want", "met",
                                                                                  "per pair"],
                          [(k, v["measured"], v["target"], v["met"], ", ".join(f"{x:.2f}" for x in v["per_repeat"]))
                           for k, v in targets.items()]))
    for key, by_process in profiles.items():
        for proc, prof in by_process.items():
            emit_table(make_table(f"py-spy {key} {proc}: share of {prof['samples']} samples", ["where", "share"],
                                  [(k, f"{100 * v:.1f}%") for k, v in prof["share"].items()]))
    for epochs, by_stack in timelines.items():
        steps = list(next(iter(by_stack.values())))
        emit_table(make_table(f"one round's timeline at {epochs} epochs (ms after the round's start; client CPU ms "
                              "per client and round), medians of an extra marked run", ["step", *by_stack],
                              [(k, *(f"{s.get(k, float('nan')):.2f}" for s in by_stack.values())) for k in steps]))
    flwr_version = subprocess.run([str(python), "-c", "import flwr; print(flwr.__version__)"], capture_output=True,
                                  text=True).stdout.strip()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"config": {k: str(v) for k, v in vars(args).items()}, "flwr": flwr_version,
                                    "cpus": os.cpu_count(), "loadavg_end": os.getloadavg(), "summary": summary,
                                    "targets": targets, "profiles": profiles, "timelines": timelines,
                                    "runs": results}, indent=1))
    log(f"wrote {args.out}")
    return 0 if targets and all(t["met"] for t in targets.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
