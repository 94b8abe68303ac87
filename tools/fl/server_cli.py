"""fl-server command line: run (gRPC), simulate (virtual clock), report (a finished run), certs (TLS files)."""
from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import typer

from mlsyskit.core.cli import (
    ensure_out_dir,
    json_option,
    load_command_config,
    make_app,
    out_option,
    quiet_option,
    run_app,
    verbose_option,
)
from mlsyskit.core.console import debug, emit_json, emit_table, log, make_table, reporter, set_verbosity, warn
from mlsyskit.core.errors import RuntimeFailure, UsageError
from mlsyskit.core.rpc import RpcError
from mlsyskit.core.sim import Seeds
from mlsyskit.core.storage import MetaStore, StorageError
from mlsyskit.tools.fl.config import DATASETS, PARTITIONS, JobConfig, check_address
from mlsyskit.tools.fl.outcome import RoundOutcome
from mlsyskit.tools.fl.report import DB_NAME, BaselineMismatch, load_run, plot, summarize
from mlsyskit.tools.fl.strategy import STRATEGIES

log_ = logging.getLogger("mlsyskit.fl.server")

app = make_app(
    "fl-server",
    "Federated learning server (after TIFF, CLOUD'22): selects clients each round, aggregates their "
    "updates and runs a token economy that pays providers of good data and starves bad data.",
)

STRATEGY = typer.Option(None, "--strategy", help=f"{' | '.join(STRATEGIES.names())} (default tiff).")
DATASET = typer.Option(None, "--dataset", help=f"{' | '.join(DATASETS)} or package.module:loader, a function "
                       "(num_clients, seed) -> (x, y, partition or None) (default digits).")
SCHEDULER = typer.Option(None, "--scheduler", help="Who trains each round and its deadline: random | tifl | oort | "
                         "fast | rfair | afair | perf | adaptive (docs/fl-scheduling.md); with --strategy tiff it picks "
                         "among the providers TIFF trusts. Default: the strategy's own selection.")
MODEL = typer.Option(None, "--model", help="package.module:factory, a function (num_features, num_classes) -> "
                     "torch nn.Module, trained by every client (default: the built-in MLP). Weights travel as raw "
                     "buffers; a client whose model shapes differ is refused at registration.")
CLIENTS = typer.Option(None, "--clients", help="Number of clients (data partitions).")
PER_ROUND = typer.Option(None, "--per-round", help="Clients selected per round.")
ROUNDS = typer.Option(None, "--rounds", help="Rounds to run.")
PARTITION = typer.Option(None, "--partition", help=f"{' | '.join(PARTITIONS)} (digits, mnist1d; synthetic "
                         "clients each draw their own LEAF distribution, so it ignores this).")
ALPHA = typer.Option(None, "--alpha", help="Dirichlet concentration (smaller = more label skew); LEAF's "
                     "synthetic(alpha, beta) are data.synthetic_alpha/_beta in --config.")
SEED = typer.Option(None, "--seed", help="Master seed (data, model, selection; default 0).")
FRESH = typer.Option(False, "--fresh", help="Discard an existing run in --run-dir instead of resuming it.")
JOB_CONFIG = typer.Option(None, "--config", dir_okay=False,
                          help="TOML job file: any JobConfig field, e.g. rounds = 20 and [economy] "
                               "quality_exponent = 1.5; flags given here override it.")


def _job(config: Path | None, strategy, dataset, clients, per_round, rounds, partition, alpha, seed, model=None,
         **extra) -> JobConfig:
    overrides = {"strategy": strategy, "rounds": rounds, "per_round": per_round, "seed": seed, "train.model": model,
                 "data.dataset": dataset, "data.num_clients": clients, "data.partition": partition,
                 "data.alpha": alpha, "data.seed": seed, **extra}
    job = load_command_config(JobConfig, config, overrides)
    if job.strategy not in STRATEGIES.names():
        raise UsageError(f"--strategy must be one of {', '.join(STRATEGIES.names())}, got {job.strategy!r}")
    if job.scheduler:
        from mlsyskit.tools.fl.scheduling import SCHEDULERS

        if job.scheduler not in SCHEDULERS.names():
            raise UsageError(f"--scheduler must be one of {', '.join(SCHEDULERS.names())}, got {job.scheduler!r}")
    return job


def _open_store(run_dir: Path, fresh: bool = False) -> MetaStore:
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        if fresh:
            for path in run_dir.glob(f"{DB_NAME}*"):
                path.unlink()
            (run_dir / "events.jsonl").unlink(missing_ok=True)
        return MetaStore(run_dir / DB_NAME)
    except (OSError, StorageError) as e:
        raise UsageError(f"cannot use run directory {run_dir}: {e}") from None


def _round_progress(rep, total: int):
    rep.start("round", total=total)

    def on_round(outcome: RoundOutcome) -> None:
        counts = {s: len(outcome.with_status(s)) for s in ("valid", "rejected", "failed")}
        note = (f"acc {outcome.global_metrics['accuracy']:.3f}  ok {counts['valid']} rej {counts['rejected']} "
                f"fail {counts['failed']}")
        rep.update(completed=outcome.round, note=note)
        debug(f"round {outcome.round}/{total}: {note}, selected {outcome.selected}, {outcome.duration_s:.2f}s")

    return on_round


def _run_dir_option(default: str) -> Any:
    return typer.Option(Path(default), "--run-dir", file_okay=False,
                        help="Checkpoints, ledger and events.jsonl; an existing run resumes.")


@app.command()
def run(config: Path | None = JOB_CONFIG, strategy: str | None = STRATEGY, dataset: str | None = DATASET,
        model: str | None = MODEL, scheduler: str | None = SCHEDULER,
        clients: int | None = CLIENTS, per_round: int | None = PER_ROUND, rounds: int | None = ROUNDS,
        partition: str | None = PARTITION, alpha: float | None = ALPHA, seed: int | None = SEED,
        address: str = typer.Option("127.0.0.1:7070", "--address", help="HOST:PORT to listen on."),
        run_dir: Path = _run_dir_option("runs/fl-server"),
        round_timeout: float | None = typer.Option(None, "--round-timeout", help="Per-round deadline, seconds."),
        registration_timeout: float = typer.Option(300.0, "--registration-timeout",
                                                   help="Give up when fewer than --min-clients are connected "
                                                        "for this long."),
        min_clients: int | None = typer.Option(None, "--min-clients",
                                               help="Connected clients a round needs; the job goes on while at least "
                                                    "this many are connected (default 2)."),
        fill_timeout: float | None = typer.Option(None, "--fill-timeout",
                                                  help="Seconds a round then waits for --per-round connected clients "
                                                       "before selecting among fewer (default 5)."),
        certs: Path | None = typer.Option(None, "--certs", file_okay=False,
                                          help="Folder from `fl-server certs`: TLS with server.pem/.key, and each "
                                               "client known by its certificate signed by ca.pem (mutual TLS)."),
        tls_cert: Path | None = typer.Option(None, "--tls-cert", help="Server certificate (PEM) for TLS."),
        tls_key: Path | None = typer.Option(None, "--tls-key", help="Server private key (PEM) for TLS."),
        tls_client_ca: Path | None = typer.Option(None, "--tls-client-ca",
                                                  help="CA (PEM) of client certificates: mutual TLS, each client "
                                                       "may act only as the id in its certificate's CN."),
        token_file: Path | None = typer.Option(None, "--token-file", help="Shared secret clients must send."),
        linger: float = typer.Option(10.0, "--linger", help="After the job, seconds to wait for clients that are "
                                     "away (reconnecting) to come back and hear that the job is done."),
        heartbeat: float = typer.Option(2.0, "--heartbeat", help="Seconds between the heartbeats clients send while "
                                        "idle (host CPU, load, memory); one silent for 3 of them is not selected "
                                        "until heard again. 0: none."),
        crash_after_round: int | None = typer.Option(None, "--crash-after-round", hidden=True,
                                                     help="Fault injection: die after committing round N."),
        fresh: bool = FRESH, json_out: bool = json_option(),
        verbose: bool = verbose_option(), quiet: bool = quiet_option()) -> None:
    """Serve a federated job over gRPC until all rounds are done (resumes from --run-dir)."""
    from mlsyskit.tools.fl.threads import freeze_startup_heap, pause_gc_for_startup, single_threaded

    set_verbosity(verbose, quiet)
    pause_gc_for_startup()
    from mlsyskit.core.telemetry import Telemetry
    from mlsyskit.tools.fl.cli_common import read_token, route_logging, server_tls
    from mlsyskit.tools.fl.coordinator import JobMismatch
    from mlsyskit.tools.fl.server import FlServer

    job = _job(config, strategy, dataset, clients, per_round, rounds, partition, alpha, seed, model,
               round_timeout_s=round_timeout, min_clients=min_clients, fill_timeout_s=fill_timeout,
               scheduler=scheduler)
    if heartbeat < 0:
        raise UsageError(f"--heartbeat must be >= 0, got {heartbeat:g}")
    if (problem := check_address(address, "--address")) is not None:
        raise UsageError(problem)
    tls = server_tls(certs, tls_cert, tls_key, tls_client_ca)
    token = read_token(token_file)
    route_logging(info_by_default=True)
    single_threaded()
    store = _open_store(run_dir, fresh)

    async def main() -> None:
        telemetry = Telemetry(log_path=run_dir / "events.jsonl")
        with reporter() as rep:
            server = FlServer(job, store, address=address, token=token, tls=tls, telemetry=telemetry,
                              on_round=_round_progress(rep, job.rounds), crash_after_round=crash_after_round,
                              linger_s=linger, heartbeat_s=heartbeat)
            port = await server.start()
            freeze_startup_heap()
            if server.coordinator.round:
                log(f"resuming after round {server.coordinator.round} from {run_dir}")
            security = ("mutual TLS (clients known by certificate)" if server.require_identity
                        else "TLS" if tls else "plaintext")
            log(f"fl-server listening on {address.rsplit(':', 1)[0]}:{port} ({security}"
                f"{', token' if token else ''}); a round needs {job.wait_for} connected clients")
            if tls is not None and not server.require_identity:
                log_.warning("clients are not authenticated one by one: anyone with the token can act as any "
                             "client id (use --certs DIR from `fl-server certs` for per-client identity)")
            try:
                await server.serve(registration_timeout)
            finally:
                await server.stop()
                telemetry.close()

    try:
        asyncio.run(main())
    except (JobMismatch, ValueError) as e:
        raise UsageError(str(e)) from None
    except RpcError as e:  # cannot listen (address in use, ...)
        raise RuntimeFailure(e.message) from None
    finally:
        store.close()
    _print_summary(summarize(load_run(run_dir)), json_out)


def malicious_clients(num_clients: int, fraction: float, attack: str, seed: int) -> dict[int, str]:
    """A seeded choice of round(fraction * N) attackers."""
    count = int(round(fraction * num_clients))
    chosen = Seeds(seed).random("malicious").sample(range(num_clients), count)
    return {cid: attack for cid in sorted(chosen)}


@app.command()
def report(run_dir: Path = typer.Option(..., "--run-dir", file_okay=False,
                                        help="A run directory from `run` or `simulate`."),
           baseline: Path | None = typer.Option(None, "--baseline", file_okay=False,
                                                help="Run directory of a default-strategy run to compare to."),
           out: Path | None = out_option("accuracy.png (accuracy per round) and tokens.png (cumulative provider "
                                         "tokens, honest vs malicious)"),
           force: bool = typer.Option(False, "--force", help="Compare with a baseline of a different job "
                                      "(seed, rounds, per-round, data or training differ) instead of refusing; "
                                      "the differences are printed as warnings."),
           json_out: bool = json_option(), verbose: bool = verbose_option(), quiet: bool = quiet_option()) -> None:
    """Tokens per honest and malicious provider (vs a baseline), accuracy, TRR/UIR per consumer."""
    set_verbosity(verbose, quiet)
    try:
        run_data = load_run(run_dir)
        base = load_run(baseline) if baseline else None
    except FileNotFoundError as e:
        raise UsageError(str(e)) from None
    except StorageError as e:
        raise RuntimeFailure(str(e)) from None
    try:
        summary = summarize(run_data, base, force)
    except BaselineMismatch as e:
        raise UsageError(str(e)) from None
    for warning in summary.get("warnings", []):
        warn(warning)
    if out is not None:
        summary["plots"] = [str(p) for p in plot(run_data, ensure_out_dir(out), base)]
    _print_summary(summary, json_out, consumers=True)


@app.command()
def certs(directory: Path = typer.Argument(..., file_okay=False, help="Folder to write into (created if missing)."),
          host: list[str] | None = typer.Option(None, "--host", help="DNS name the server certificate is valid "
                                                "for (repeat for several; default localhost, with --ip 127.0.0.1)."),
          ip: list[str] | None = typer.Option(None, "--ip", help="IP address the server certificate is valid for "
                                              "(repeat for several). Without --host and --ip an existing server "
                                              "pair is kept (so adding clients does not replace it)."),
          days: int = typer.Option(30, "--days", help="Validity in days."),
          clients: int | None = typer.Option(None, "--clients", help="Client pairs for ids 0..N-1."),
          client: list[str] = typer.Option([], "--client", help="A client pair for this id (repeat for several)."),
          json_out: bool = json_option(), verbose: bool = verbose_option(), quiet: bool = quiet_option()) -> None:
    """Write a CA, a server pair and one pair per client (CN = client id) for mutual TLS.

    Files: ca.pem, ca.key (kept: a later call adds clients signed by the same CA), server.pem, server.key,
    client-ID.pem, client-ID.key (keys 0600). Then: fl-server run --certs DIR; fl-client run --certs DIR
    --client-id ID. Give each client only its own pair and ca.pem; keep ca.key away from clients.
    """
    from mlsyskit.core.rpc_tls import issue_certs

    set_verbosity(verbose, quiet)
    if clients is not None and client:
        raise UsageError("give --clients N or --client ID, not both")
    if clients is not None and clients < 0:
        raise UsageError(f"--clients must be >= 0, got {clients}")
    ids = [str(i) for i in range(clients)] if clients is not None else list(client)
    files = issue_certs(directory, ids, hosts=host or None, ips=ip or None, days=days)
    written = {"ca": str(files.ca), "server_cert": str(files.server_cert), "server_key": str(files.server_key),
               "clients": {cid: [str(p) for p in pair] for cid, pair in files.clients.items()}}
    if json_out:
        emit_json(written)
        return
    emit_table(make_table(f"TLS files in {directory}", ["file", "for"],
                          [("ca.pem", "everyone (trust)"), ("ca.key", "only whoever issues certificates"),
                           ("server.pem + server.key", "fl-server" + (f" ({', '.join((host or []) + (ip or []))}, "
                                                                       f"{days} days)" if host or ip else ""))] +
                          [(f"client-{cid}.pem + .key", f"fl-client --client-id {cid}") for cid in files.clients]))


def _print_summary(summary: dict, json_out: bool, consumers: bool = False) -> None:
    if json_out:
        emit_json(summary)
        return
    keys = ["strategy", "rounds", "final_accuracy", "best_accuracy", "best_round", "attackers", "honest_providers",
            "malicious_providers",
            "tokens_per_honest_provider", "tokens_per_malicious_provider", "honest_tokens_vs_baseline",
            "malicious_tokens_vs_baseline", "accuracy_gain_points", "mean_trr", "pool", "infra", "ledger_total"]
    emit_table(make_table("FL run", ["metric", "value"], [(k, summary[k]) for k in keys if k in summary]))
    if consumers and "consumers" in summary:
        rows = [(cid, c["paid"], c["refund"], c["trr"], c["uir"] if c["uir"] is not None else "-")
                for cid, c in sorted(summary["consumers"].items(), key=lambda kv: int(kv[0]))]
        emit_table(make_table("consumers", ["client", "paid", "refund", "TRR", "UIR"], rows))
    if "plots" in summary:
        log(f"plots: {', '.join(summary['plots'])}")


# `simulate` lives in simulate_cli.py (the simulator's owner); registered here so `fl-server --help` lists it
from mlsyskit.tools.fl import simulate_cli  # noqa: E402

simulate_cli.register(app)


def main() -> None:
    run_app(app)
