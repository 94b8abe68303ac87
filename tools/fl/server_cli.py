"""fl-server command line: run (gRPC), simulate (virtual clock), report (a finished run)."""
from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import typer

from mlsyskit.core.cli import fail, make_app, run_app
from mlsyskit.core.config import ConfigError, load_config
from mlsyskit.core.console import emit_json, emit_table, err, log, make_table
from mlsyskit.core.rpc import RpcError, ServerTls
from mlsyskit.core.sim import Seeds
from mlsyskit.core.storage import MetaStore, StorageError
from mlsyskit.core.telemetry import Telemetry
from mlsyskit.tools.fl.config import ATTACKS, JobConfig, check_address
from mlsyskit.tools.fl.coordinator import JobMismatch
from mlsyskit.tools.fl.outcome import RoundOutcome
from mlsyskit.tools.fl.report import DB_NAME, load_run, plot, summarize
from mlsyskit.tools.fl.threads import freeze_startup_heap, pause_gc_for_startup, single_threaded

app = make_app(
    "fl-server",
    "Federated learning server (after TIFF, CLOUD'22): selects clients each round, aggregates their "
    "updates and runs a token economy that pays providers of good data and starves bad data.",
)

CONFIG = typer.Option(None, "--config", help="TOML job config (flags override it).")
STRATEGY = typer.Option(None, "--strategy", help="fedavg | tiff")
DATASET = typer.Option(None, "--dataset", help="digits | mnist1d | synthetic")
CLIENTS = typer.Option(None, "--clients", help="Number of clients (data partitions).")
PER_ROUND = typer.Option(None, "--per-round", help="Clients selected per round.")
ROUNDS = typer.Option(None, "--rounds", help="Rounds to run.")
PARTITION = typer.Option(None, "--partition", help="iid | dirichlet | shards (digits, mnist1d; synthetic clients "
                         "each draw their own LEAF distribution, so it ignores this).")
ALPHA = typer.Option(None, "--alpha", help="Dirichlet concentration (smaller = more label skew); LEAF's "
                     "synthetic(alpha, beta) are data.synthetic_alpha/_beta in --config.")
SEED = typer.Option(None, "--seed", help="Master seed (data, model, selection).")
JSON = typer.Option(False, "--json", help="Print the result as JSON on stdout.")


def _job(config: Path | None, strategy, dataset, clients, per_round, rounds, partition, alpha, seed,
         **extra) -> JobConfig:
    overrides = {"strategy": strategy, "rounds": rounds, "per_round": per_round, "seed": seed,
                 "data.dataset": dataset, "data.num_clients": clients, "data.partition": partition,
                 "data.alpha": alpha, "data.seed": seed, **extra}
    try:
        return load_config(JobConfig, config, overrides)
    except ConfigError as e:
        raise fail(str(e)) from None


FRESH = typer.Option(False, "--fresh", help="Discard an existing run in --run-dir instead of resuming it.")


def _open_store(run_dir: Path, fresh: bool = False) -> MetaStore:
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        if fresh:
            for path in run_dir.glob(f"{DB_NAME}*"):
                path.unlink()
            (run_dir / "events.jsonl").unlink(missing_ok=True)
        return MetaStore(run_dir / DB_NAME)
    except (OSError, StorageError) as e:
        raise fail(f"cannot use run directory {run_dir}: {e}") from None


def _round_line(outcome: RoundOutcome) -> None:
    counts = {s: len(outcome.with_status(s)) for s in ("valid", "rejected", "failed")}
    aggregated = sum(r.aggregated for r in outcome.reports.values())
    log(f"round {outcome.round}: acc {outcome.global_metrics['accuracy']:.3f} sel {len(outcome.selected)} "
        f"ok {counts['valid']} agg {aggregated} rej {counts['rejected']} fail {counts['failed']} "
        f"{outcome.duration_s:.2f}s")


def _read_token(path: Path | None) -> str | None:
    if path is None:
        return None
    try:
        token = path.read_text().strip()
    except OSError as e:
        raise fail(f"cannot read token file {path}: {e.strerror}") from None
    if not token:
        raise fail(f"token file {path} is empty")
    return token


@app.command()
def run(config: Path | None = CONFIG, strategy: str | None = STRATEGY, dataset: str | None = DATASET,
        clients: int | None = CLIENTS, per_round: int | None = PER_ROUND, rounds: int | None = ROUNDS,
        partition: str | None = PARTITION, alpha: float | None = ALPHA, seed: int | None = SEED,
        address: str = typer.Option("127.0.0.1:7070", "--address", help="HOST:PORT to listen on."),
        run_dir: Path = typer.Option(Path("runs/fl-server"), "--run-dir",
                                     help="Checkpoints, ledger and events; an existing run resumes."),
        round_timeout: float | None = typer.Option(None, "--round-timeout", help="Per-round deadline, seconds."),
        registration_timeout: float = typer.Option(300.0, "--registration-timeout",
                                                   help="Give up if too few clients join within this."),
        tls_cert: Path | None = typer.Option(None, "--tls-cert", help="Server certificate (PEM) for TLS."),
        tls_key: Path | None = typer.Option(None, "--tls-key", help="Server private key (PEM) for TLS."),
        token_file: Path | None = typer.Option(None, "--token-file", help="Shared secret clients must send."),
        min_clients: int | None = typer.Option(None, "--min-clients",
                                               help="Connected clients each round waits for (default: all)."),
        crash_after_round: int | None = typer.Option(None, "--crash-after-round", hidden=True,
                                                     help="Fault injection: die after committing round N."),
        fresh: bool = FRESH, json_out: bool = JSON) -> None:
    """Serve a federated job over gRPC until all rounds are done (resumes from --run-dir)."""
    pause_gc_for_startup()
    from mlsyskit.tools.fl.server import FlServer

    job = _job(config, strategy, dataset, clients, per_round, rounds, partition, alpha, seed,
               round_timeout_s=round_timeout, min_clients=min_clients)
    if (problem := check_address(address, "--address")) is not None:
        raise fail(problem)
    if (tls_cert is None) != (tls_key is None):
        raise fail("--tls-cert and --tls-key go together")
    try:
        tls = ServerTls.from_files(tls_cert, tls_key) if tls_cert else None
    except RpcError as e:
        raise fail(e.message) from None
    token = _read_token(token_file)
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    single_threaded()
    store = _open_store(run_dir, fresh)

    async def main() -> FlServer:
        telemetry = Telemetry(log_path=run_dir / "events.jsonl")
        server = FlServer(job, store, address=address, token=token, tls=tls, telemetry=telemetry,
                          on_round=_round_line, crash_after_round=crash_after_round)
        port = await server.start()
        freeze_startup_heap()
        if server.coordinator.round:
            log(f"resuming after round {server.coordinator.round} from {run_dir}")
        log(f"fl-server listening on {address.rsplit(':', 1)[0]}:{port} ({'TLS' if tls else 'plaintext'}"
            f"{', token' if token else ''}); waiting for {job.wait_for} clients")
        try:
            await server.serve(registration_timeout)
        finally:
            await server.stop()
            telemetry.close()
        return server

    try:
        asyncio.run(main())
    except (JobMismatch, ValueError) as e:
        raise fail(str(e)) from None
    except RpcError as e:
        raise fail(e.message) from None
    finally:
        store.close()
    _print_summary(summarize(load_run(run_dir)), json_out)


@app.command()
def simulate(config: Path | None = CONFIG, strategy: str | None = STRATEGY, dataset: str | None = DATASET,
             clients: int | None = CLIENTS, per_round: int | None = PER_ROUND, rounds: int | None = ROUNDS,
             partition: str | None = PARTITION, alpha: float | None = ALPHA, seed: int | None = SEED,
             malicious: float = typer.Option(0.0, "--malicious", help="Fraction of clients that attack."),
             attack: str = typer.Option("label-flip", "--attack", help="label-flip | noisy-labels | random-update"),
             dropout: float = typer.Option(0.0, "--dropout", help="Chance a selected client vanishes mid-round."),
             run_dir: Path = typer.Option(Path("runs/fl-sim"), "--run-dir", help="Where the run's store goes."),
             fresh: bool = FRESH, json_out: bool = JSON) -> None:
    """The same server logic with in-process clients on a virtual clock (deterministic for a seed)."""
    from mlsyskit.tools.fl.simulator import Simulation

    job = _job(config, strategy, dataset, clients, per_round, rounds, partition, alpha, seed)
    if attack not in ATTACKS or attack == "none":
        raise fail(f"--attack must be one of {', '.join(a for a in ATTACKS if a != 'none')}")
    if not 0 <= malicious < 1 or not 0 <= dropout < 1:
        raise fail("--malicious and --dropout must be in [0, 1)")
    attacks = malicious_clients(job.data.num_clients, malicious, attack, job.seed)
    single_threaded()
    store = _open_store(run_dir, fresh)
    try:
        Simulation(job, store, attacks, dropout).run(on_round=_round_line)
    except (JobMismatch, ValueError) as e:
        raise fail(str(e)) from None
    finally:
        store.close()
    _print_summary(summarize(load_run(run_dir)), json_out)


def malicious_clients(num_clients: int, fraction: float, attack: str, seed: int) -> dict[int, str]:
    """A seeded choice of round(fraction * N) attackers."""
    count = int(round(fraction * num_clients))
    chosen = Seeds(seed).random("malicious").sample(range(num_clients), count)
    return {cid: attack for cid in sorted(chosen)}


@app.command()
def report(run_dir: Path = typer.Argument(..., help="A run directory from `run` or `simulate`."),
           baseline: Path | None = typer.Option(None, "--baseline", help="A default-strategy run to compare to."),
           plots: Path | None = typer.Option(None, "--plots", help="Write accuracy.png and tokens.png here."),
           json_out: bool = JSON) -> None:
    """Tokens per honest and malicious provider (vs a baseline), accuracy, TRR/UIR per consumer."""
    try:
        run_data = load_run(run_dir)
        base = load_run(baseline) if baseline else None
    except (FileNotFoundError, StorageError) as e:
        raise fail(str(e)) from None
    summary = summarize(run_data, base)
    if plots is not None:
        summary["plots"] = [str(p) for p in plot(run_data, plots, base)]
    _print_summary(summary, json_out, consumers=True)


def _print_summary(summary: dict, json_out: bool, consumers: bool = False) -> None:
    if json_out:
        emit_json(summary)
        return
    keys = ["strategy", "rounds", "final_accuracy", "best_accuracy", "honest_providers", "malicious_providers",
            "tokens_per_honest_provider", "tokens_per_malicious_provider", "honest_tokens_vs_baseline",
            "malicious_tokens_vs_baseline", "accuracy_gain_points", "mean_trr", "pool", "infra", "ledger_total"]
    emit_table(make_table("FL run", ["metric", "value"], [(k, summary[k]) for k in keys if k in summary]))
    if consumers and "consumers" in summary:
        rows = [(cid, c["paid"], c["refund"], c["trr"], c["uir"] if c["uir"] is not None else "-")
                for cid, c in sorted(summary["consumers"].items(), key=lambda kv: int(kv[0]))]
        emit_table(make_table("consumers", ["client", "paid", "refund", "TRR", "UIR"], rows))
    if "plots" in summary:
        err.print(f"plots: {', '.join(summary['plots'])}")


def main() -> None:
    run_app(app)
