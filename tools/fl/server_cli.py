"""fl-server command line: run (gRPC), partition (per-client folders), simulate (virtual clock), report, certs."""
from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import typer

from mlsyskit.core.cli import (
    ensure_out_dir,
    json_option,
    make_app,
    out_option,
    quiet_option,
    run_app,
    verbose_option,
)
from mlsyskit.core.console import emit_json, emit_table, log, make_table, reporter, set_verbosity, warn
from mlsyskit.core.errors import RuntimeFailure, UsageError
from mlsyskit.core.rpc import RpcError
from mlsyskit.core.rpc_tls import issue_certs
from mlsyskit.core.storage import StorageError
from mlsyskit.core.telemetry import Telemetry
from mlsyskit.tools.fl import server_options as opt
from mlsyskit.tools.fl.cli_common import read_token, route_logging, server_tls
from mlsyskit.tools.fl.config import OWN_DATA, check_address
from mlsyskit.tools.fl.coordinator import JobMismatch
from mlsyskit.tools.fl.local_data import load_server_data
from mlsyskit.tools.fl.partition import write_partition
from mlsyskit.tools.fl.plugins import UserCodeError
from mlsyskit.tools.fl.report import BaselineMismatch, load_run, plot, summarize
from mlsyskit.tools.fl.server import FlServer
from mlsyskit.tools.fl.simulate_cli import simulate
from mlsyskit.tools.fl.threads import freeze_startup_heap, pause_gc_for_startup, single_threaded

log_ = logging.getLogger("mlsyskit.fl.server")

app = make_app(
    "fl-server",
    "Federated learning server (after TIFF, CLOUD'22): selects clients each round, aggregates their "
    "updates and runs a token economy that pays providers of good data and starves bad data. Clients hold "
    "their own data (fl-client run --data); the server holds only a validation (root) set and a test set.",
)

@app.command()
def run(config: Path | None = opt.JOB_CONFIG, strategy: str | None = opt.STRATEGY, model: str | None = opt.MODEL,
        scheduler: str | None = opt.SCHEDULER, clients: int | None = opt.CLIENTS,
        per_round: int | None = opt.PER_ROUND, rounds: int | None = opt.ROUNDS, seed: int | None = opt.SEED,
        validation: str = typer.Option(..., "--validation", help="The server's own labelled root/validation set "
                                       "(FLTrust's root dataset: TIFF verifies every update against it and the job "
                                       "keeps the model that scores best on it): a folder, an .npz (x, y) or .csv "
                                       "file, or package.module:loader (see fl-client run --data). It also sets the "
                                       "task: its number of features."),
        test: str | None = typer.Option(None, "--test", help="Test set for the reported accuracy (same formats; "
                                        "default: the --validation folder's test split, else the validation set)."),
        classes: int | None = typer.Option(None, "--classes", help="Number of classes (default: the largest label "
                                           "in --validation/--test + 1)."),
        address: str = typer.Option("127.0.0.1:7070", "--address", help="HOST:PORT to listen on."),
        run_dir: Path = opt.run_dir_option("runs/fl-server"),
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
        fresh: bool = opt.FRESH, json_out: bool = json_option(),
        verbose: bool = verbose_option(), quiet: bool = quiet_option()) -> None:
    """Serve a federated job over gRPC until all rounds are done (resumes from --run-dir).

    Clients hold their own data: the job names the model and the task (features, classes), never a client's
    data; each client says how many training samples it has. Try it on one machine: `fl-server partition`.
    """
    set_verbosity(verbose, quiet)
    pause_gc_for_startup()  # until the server is ready (freeze_startup_heap)
    job = opt.make_job(config, strategy, OWN_DATA, clients, per_round, rounds, None, None, seed, model,
                       round_timeout_s=round_timeout, min_clients=min_clients, fill_timeout_s=fill_timeout,
                       scheduler=scheduler)
    if heartbeat < 0:
        raise UsageError(f"--heartbeat must be >= 0, got {heartbeat:g}")
    if (problem := check_address(address, "--address")) is not None:
        raise UsageError(problem)
    if classes is not None and classes < 2:
        raise UsageError(f"--classes must be at least 2, got {classes}")
    try:
        server_data = load_server_data(validation, test, classes, job.data.input_scaling)
    except UserCodeError as e:
        raise opt.user_code_failed(e) from None
    except ValueError as e:
        raise UsageError(str(e)) from None
    tls = server_tls(certs, tls_cert, tls_key, tls_client_ca)
    token = read_token(token_file)
    route_logging(info_by_default=True)
    single_threaded()
    store = opt.open_store(run_dir, fresh)
    try:
        asyncio.run(_serve(job, store, server_data, run_dir, address, token, tls, registration_timeout,
                           dict(crash_after_round=crash_after_round, linger_s=linger, heartbeat_s=heartbeat)))
    except UserCodeError as e:
        raise opt.user_code_failed(e) from None
    except (JobMismatch, ValueError) as e:
        raise UsageError(str(e)) from None
    except RpcError as e:  # cannot listen (address in use, ...)
        raise RuntimeFailure(e.message) from None
    finally:
        store.close()
    opt.print_summary(summarize(load_run(run_dir)), json_out)


async def _serve(job, store, server_data, run_dir: Path, address: str, token, tls, registration_timeout: float,
                 options: dict) -> None:
    telemetry = Telemetry(log_path=run_dir / "events.jsonl")
    with reporter() as rep:
        server = FlServer(job, store, server=server_data, address=address, token=token, tls=tls,
                          telemetry=telemetry, on_round=opt.round_progress(rep, job.rounds), **options)
        try:
            port = await server.start()
            freeze_startup_heap()
            if server.coordinator.round:
                log(f"resuming after round {server.coordinator.round} from {run_dir}")
            security = ("mutual TLS (clients known by certificate)" if server.require_identity
                        else "TLS" if tls else "plaintext")
            log(f"fl-server listening on {address.rsplit(':', 1)[0]}:{port} ({security}"
                f"{', token' if token else ''}); task: {server_data.num_features} features, "
                f"{server_data.num_classes} classes; a round needs {job.wait_for} connected clients")
            if tls is not None and not server.require_identity:
                log_.warning("clients are not authenticated one by one: anyone with the token can act as any "
                             "client id (use --certs DIR from `fl-server certs` for per-client identity)")
            await server.serve(registration_timeout)
        finally:
            await server.stop()
            telemetry.close()


@app.command()
def partition(dataset: str | None = opt.DATASET, clients: int | None = opt.CLIENTS,
              partition: str | None = opt.PARTITION, alpha: float | None = opt.ALPHA, seed: int | None = opt.SEED,
              out: Path = typer.Option(..., "--out", file_okay=False, help="Folder to write: client-K/ per client "
                                       "(train.npz, test.npz), server/ (validation.npz, test.npz), task.json."),
              config: Path | None = opt.JOB_CONFIG, json_out: bool = json_option(),
              verbose: bool = verbose_option(), quiet: bool = quiet_option()) -> None:
    """Split a dataset into per-client folders, to try a real federation on one machine (N clients, N processes).

    Then: fl-server run --validation OUT/server ...; fl-client run --data OUT/client-K ... (README: "Run a real
    federation"). Each client's folder is its own: give every client process only its folder.
    """
    set_verbosity(verbose, quiet)
    job = opt.make_job(config, None, dataset, clients, 1, None, partition, alpha, seed)  # per_round: unused here
    try:
        written = write_partition(job.data, out)
    except UserCodeError as e:
        raise opt.user_code_failed(e) from None
    except ValueError as e:
        raise UsageError(str(e)) from None
    except OSError as e:
        raise RuntimeFailure(f"cannot write {out}: {e.strerror or e}") from None
    if json_out:
        emit_json(written)
        return
    emit_table(make_table(f"{job.data.num_clients} clients in {out}", ["folder", "holds"],
                          [("server/", f"validation {written['validation']} + test {written['test']} samples"),
                           *((f"client-{cid}/", f"train {n} samples") for cid, n in
                             list(written["clients"].items())[:10])]))
    if job.data.num_clients > 10:
        log(f"... and {job.data.num_clients - 10} more client folders")


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
    opt.print_summary(summary, json_out, consumers=True)


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
    --client-id ID --data DIR. Give each client only its own pair and ca.pem; keep ca.key away from clients.
    """
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


app.command()(simulate)  # simulate_cli.py: the simulator's flags live next to the simulator


def main() -> None:
    run_app(app)
