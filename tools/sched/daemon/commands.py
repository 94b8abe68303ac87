"""The daemon's commands on the `marble` app: serve, submit, status, queue, cancel, logs, nodes.

Clients find the daemon through its state directory (daemon.json + token, written by `serve`),
or --addr/--token-file/--tls-ca; MLSYSKIT_MARBLE_STATE_DIR and MLSYSKIT_MARBLE_ADDR set them for
every command.
"""
from __future__ import annotations

import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import typer

from mlsyskit.core.cli import ensure_out_dir, json_option, out_option, quiet_option, verbose_option
from mlsyskit.core.clock import RealClock
from mlsyskit.core.console import emit_json, emit_table, log, make_table, reporter, set_verbosity
from mlsyskit.core.errors import UsageError
from mlsyskit.tools.sched.daemon.client import DaemonClient, Endpoint, default_state_dir
from mlsyskit.tools.sched.daemon.serve_command import register_serve
from mlsyskit.tools.sched.daemon.specs import job_from_mapping


def state_dir_option() -> Any:
    return typer.Option(None, "--state-dir", envvar="MLSYSKIT_MARBLE_STATE_DIR",
                        help="The daemon's folder (job table, logs, token, daemon.json); "
                             "default $XDG_STATE_HOME/marble or ~/.local/state/marble.")


def _client(state_dir: Path | None, addr: str | None, token_file: Path | None, tls_ca: Path | None) -> DaemonClient:
    return DaemonClient(Endpoint.resolve(state_dir or default_state_dir(), addr, token_file, tls_ca))


def _addr_option() -> Any:
    return typer.Option(None, "--addr", envvar="MLSYSKIT_MARBLE_ADDR", help="HOST:PORT of the daemon (default: daemon.json).")


def _token_option() -> Any:
    return typer.Option(None, "--token-file", help="The daemon's shared secret (default: from daemon.json).")


def _ca_option() -> Any:
    return typer.Option(None, "--tls-ca", help="CA that signed the daemon's TLS certificate (default: from daemon.json).")


def _when(t: float | None) -> str:
    return "-" if t is None else datetime.fromtimestamp(t).strftime("%H:%M:%S")


def _jobs_table(title: str, jobs: list[dict]) -> None:
    """Fits 80 columns: app, times and the command are in --json."""
    rows = [[j["id"], j["name"], j["state"], f"{j['gpus_requested']}/{sum(len(v) for v in j['gpus'].values())}",
             j["where"] or "-", _when(j["started"]),
             j["reason"] or ("-" if j["exit_code"] is None else f"exit {j['exit_code']}")] for j in jobs]
    emit_table(make_table(title, ["id", "name", "state", "gpus", "where", "started", "result"], rows))


def register(app: typer.Typer) -> None:
    @app.command()
    def submit(
        job_file: Path | None = typer.Argument(None, help="job.toml (cmd, app, gpus, min_gpus, max_gpus, name, ...)."),
        cmd: str | None = typer.Option(None, "--cmd", help="Shell command to run."),
        app_name: str | None = typer.Option(None, "--app", help="Application the throughput model knows (marble model)."),
        gpus: int | None = typer.Option(None, "--gpus", help="GPUs the job asks for."),
        min_gpus: int | None = typer.Option(None, "--min-gpus", help="Fewest GPUs it can run on (default 1)."),
        max_gpus: int | None = typer.Option(None, "--max-gpus", help="Most GPUs it can use (default --gpus)."),
        name: str | None = typer.Option(None, "--name", help="A name to show."),
        batch_size: int | None = typer.Option(None, "--batch-size", help="Global batch (default: per app)."),
        workdir: Path | None = typer.Option(None, "--workdir", help="Working directory (default: this one)."),
        state_dir: Path | None = state_dir_option(), addr: str | None = _addr_option(),
        token_file: Path | None = _token_option(), tls_ca: Path | None = _ca_option(), as_json: bool = json_option(),
    ) -> None:
        """Queue a job from job.toml or flags (flags override the file)."""
        from mlsyskit.core.config import load_toml

        data: dict[str, Any] = dict(load_toml(job_file)) if job_file else {}
        flags = {"cmd": cmd, "app": app_name, "gpus": gpus, "min_gpus": min_gpus, "max_gpus": max_gpus, "name": name,
                 "batch_size": batch_size}
        data.update({k: v for k, v in flags.items() if v is not None})
        data.setdefault("workdir", str((workdir or Path.cwd()).absolute()))
        job_from_mapping(data, where=str(job_file) if job_file else "job")  # field errors before any network
        job = _client(state_dir, addr, token_file, tls_ca).call("submit", {"job": data})
        if as_json:
            emit_json(job)
        else:
            log(f"job {job['id']} queued ({job['name']})")
            sys.stdout.write(f"{job['id']}\n")

    @app.command()
    def status(job: int | None = typer.Argument(None, help="Job id (default: all jobs)."),
               state_dir: Path | None = state_dir_option(), addr: str | None = _addr_option(),
               token_file: Path | None = _token_option(), tls_ca: Path | None = _ca_option(),
               as_json: bool = json_option()) -> None:
        """Jobs and their state, GPUs, times and exit codes."""
        jobs = _client(state_dir, addr, token_file, tls_ca).call("status", {"job": job})["jobs"]
        emit_json(jobs) if as_json else _jobs_table("marble jobs (gpus = asked/held)", jobs)

    @app.command()
    def queue(state_dir: Path | None = state_dir_option(), addr: str | None = _addr_option(),
              token_file: Path | None = _token_option(), tls_ca: Path | None = _ca_option(),
              as_json: bool = json_option()) -> None:
        """Jobs waiting or holding GPUs."""
        jobs = _client(state_dir, addr, token_file, tls_ca).call("queue")["jobs"]
        emit_json(jobs) if as_json else _jobs_table("marble queue", jobs)

    @app.command()
    def cancel(job: int = typer.Argument(..., help="Job id."), state_dir: Path | None = state_dir_option(),
               addr: str | None = _addr_option(), token_file: Path | None = _token_option(),
               tls_ca: Path | None = _ca_option(), as_json: bool = json_option()) -> None:
        """Cancel a job: a queued one at once, a running one by stopping its processes."""
        doc = _client(state_dir, addr, token_file, tls_ca).call("cancel", {"job": job})
        emit_json(doc) if as_json else log(f"job {job}: {doc['state']}")

    @app.command()
    def logs(job: int = typer.Argument(..., help="Job id."),
             follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing until the job ends."),
             state_dir: Path | None = state_dir_option(), addr: str | None = _addr_option(),
             token_file: Path | None = _token_option(), tls_ca: Path | None = _ca_option()) -> None:
        """A job's output (stdout and stderr together)."""
        client = _client(state_dir, addr, token_file, tls_ca)
        offset = 0
        while True:
            chunk = client.call("logs", {"job": job, "offset": offset})
            sys.stdout.buffer.write(chunk["data"])
            sys.stdout.flush()
            offset = chunk["offset"]
            if not follow or chunk["ended"]:
                break
            if not chunk["data"]:
                time.sleep(0.5)  # polling for new output, not synchronising

    @app.command()
    def nodes(state_dir: Path | None = state_dir_option(), addr: str | None = _addr_option(),
              token_file: Path | None = _token_option(), tls_ca: Path | None = _ca_option(),
              as_json: bool = json_option()) -> None:
        """Nodes, their GPUs and which job holds each."""
        rows = _client(state_dir, addr, token_file, tls_ca).call("nodes")["nodes"]
        if as_json:
            emit_json(rows)
            return
        emit_table(make_table("marble nodes", ["node", "host", "gpus", "used", "free", "device: job"],
                              [[r["node"], r["host"], r["gpus"], r["used"], r["free"],
                                " ".join(f"{d}:{j if j is not None else '-'}" for d, j in r["devices"].items())]
                               for r in rows]))

    @app.command()
    def profile(
        cmd: str = typer.Option(..., "--cmd", help="The job to measure (it must honour MARBLE_PROFILE_OUT; see "
                                                   "tools/sched/examples/ddp_train.py)."),
        gpus: str = typer.Option("1,2,4", "--gpus", help="GPU counts to run it on, one node (1..9 each)."),
        seconds: float = typer.Option(5.0, "--seconds", min=0.5, max=3600.0, help="Measuring time per run, after warm-up."),
        timeout: float = typer.Option(300.0, "--timeout", min=1.0, help="Kill a run that takes longer than this."),
        app_name: str = typer.Option("myjob", "--app", help="Name of the application profile written to --out."),
        out: Path | None = out_option("profile.json, APP/placements.csv (for marble serve --profiles OUT), "
                                      "runs/GPUS/output.log"),
        as_json: bool = json_option(), verbose: bool = verbose_option(), quiet: bool = quiet_option(),
    ) -> None:
        """Measure a job's throughput on several GPU counts and fit marble's scaling model to it."""
        import tempfile

        from mlsyskit.tools.sched.daemon import profiler

        set_verbosity(verbose, quiet)
        counts = _gpu_counts(gpus)
        if not app_name.replace("-", "").replace("_", "").isalnum():
            raise UsageError(f"--app {app_name!r}: use letters, digits, - and _")
        root = ensure_out_dir(out) if out else Path(tempfile.mkdtemp(prefix="marble-profile-"))
        measurements = []
        with reporter() as rep:
            rep.start("profiling", total=len(counts), unit="placements")
            for k in counts:
                m = profiler.measure(cmd, k, seconds, (root / "runs" / str(k)).absolute(), str(Path.cwd()),
                                     RealClock(), timeout)
                measurements.append(m)
                rep.advance(note=f"{k} GPU(s): {m.samples_per_s:,.0f} samples/s")
        report = profiler.fit_report(measurements)
        if out:
            profiler.write_profile(root, app_name, measurements, report)
            log(f"wrote {root / 'profile.json'} and {root / app_name / 'placements.csv'}")
        if as_json:
            emit_json({"app": app_name, **report})
            return
        emit_table(make_table(f"{app_name}: measured throughput and the fitted model (one node)",
                              ["GPUs", "samples/s", "speedup", "efficiency", "model samples/s", "fit error",
                               "leave-one-out error"],
                              [[c["gpus"], c["samples_per_s"], c["speedup"], c["efficiency"], c["model_samples_per_s"],
                                _pct(c["fit_error"]), _pct(c["leave_one_out_error"])] for c in report["curve"]]))
        coef = report["model"]
        sys.stdout.write(f"model: compute(m) = {coef['c0']:.4g} + {coef['c1']:.4g} m s; sync(K) = "
                         f"{coef['l0']:.4g} + {coef['l1']:.4g} (K - 2) s on one node; mean error "
                         f"{_pct(report['mean_fit_error'])} in-sample, "
                         f"{_pct(report['mean_leave_one_out_error'])} leave-one-out\n")

    register_serve(app)
    del submit, status, queue, cancel, logs, nodes, profile


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _gpu_counts(text: str) -> list[int]:
    try:
        counts = [int(p) for p in text.split(",") if p.strip()]
    except ValueError:
        raise UsageError(f"--gpus {text!r}: expected comma-separated counts like 1,2,4") from None
    if not counts or any(not 1 <= k <= 9 for k in counts) or len(set(counts)) != len(counts):
        raise UsageError(f"--gpus {text!r}: distinct counts in 1..9 (one node) expected")
    return sorted(counts)


__all__ = ["register"]
