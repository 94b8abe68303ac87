"""fl-client command line."""
from __future__ import annotations

import asyncio
from pathlib import Path

import typer

from mlsyskit.core.cli import (
    config_option,
    json_option,
    load_command_config,
    make_app,
    quiet_option,
    run_app,
    verbose_option,
)
from mlsyskit.core.console import debug, emit_json, log, set_verbosity
from mlsyskit.core.errors import RuntimeFailure, UsageError
from mlsyskit.tools.fl.config import ATTACKS, ClientConfig, parse_slowdown

app = make_app(
    "fl-client",
    "Federated learning client: holds its own data (--data, never sent anywhere), registers with an "
    "fl-server, trains when selected and reports its update with measured quality and resource use. It "
    "reconnects on its own after any lost connection (a server restart included).",
)


def _path(value: str | None) -> Path | None:
    return None if value is None else Path(value)


@app.command()
def run(server: str | None = typer.Option(None, "--server", help="fl-server HOST:PORT (default 127.0.0.1:7070)."),
        client_id: int | None = typer.Option(None, "--client-id", help="This client's id (0..N-1): its ledger "
                                             "account, and with --certs the CN of its certificate."),
        data: str | None = typer.Option(None, "--data", help="This client's own data, loaded by this process only: "
                                        "a folder (train.npz or train.csv, optionally test.npz/.csv; what `fl-server "
                                        "partition` writes), an .npz file with arrays x and y, a .csv file (features, "
                                        "then the integer label, per row), or package.module:loader, a function () "
                                        "-> (x, y) or (x_train, y_train, x_test, y_test)."),
        model: str | None = typer.Option(None, "--model", help="package.module:factory that builds the job's model "
                                         "here, (num_features, num_classes) -> torch nn.Module (default: the target "
                                         "the job names; the built-in MLP needs none). Shapes are checked at join."),
        attack: str | None = typer.Option(None, "--attack", help=f"Behave as an attacker: {' | '.join(ATTACKS)} "
                                          "(default none; for experiments)."),
        certs: Path | None = typer.Option(None, "--certs", file_okay=False,
                                          help="Folder from `fl-server certs`: uses ca.pem and client-ID.pem/.key "
                                               "(mutual TLS: the server knows this client by its certificate)."),
        tls_ca: Path | None = typer.Option(None, "--tls-ca", help="CA (PEM) that signed the server certificate."),
        tls_cert: Path | None = typer.Option(None, "--tls-cert", help="This client's certificate (PEM), mutual TLS."),
        tls_key: Path | None = typer.Option(None, "--tls-key", help="This client's private key (PEM), mutual TLS."),
        tls_server_name: str | None = typer.Option(None, "--tls-server-name",
                                                   help="Name to check in the server certificate."),
        token_file: Path | None = typer.Option(None, "--token-file", help="Shared secret the server expects."),
        reconnect: float | None = typer.Option(None, "--reconnect",
                                               help="Give up after this many seconds without a server (default 60)."),
        slowdown: str | None = typer.Option(None, "--slowdown", hidden=True,
                                            help="Fault injection: ROUND:SECONDS, from that round on each local "
                                                 "training takes SECONDS longer (a slower or contended device)."),
        config: Path | None = config_option(), json_out: bool = json_option(),
        verbose: bool = verbose_option(), quiet: bool = quiet_option()) -> None:
    """Join a server and take part until the job is done (-v: selection, receipt and balance per round)."""
    from mlsyskit.tools.fl.threads import pause_gc_for_startup

    set_verbosity(verbose, quiet)
    pause_gc_for_startup()  # until the client is ready (FlClient(freeze_heap=True))
    from mlsyskit.tools.fl.cli_common import client_tls, read_token, route_logging
    from mlsyskit.tools.fl.client import ClientStopped, FlClient
    from mlsyskit.tools.fl.local_data import load_client_data
    from mlsyskit.tools.fl.plugins import UserCodeError, load_object

    settings = load_command_config(ClientConfig, config, {
        "server": server, "client_id": client_id, "data": data, "model": model, "attack": attack,
        "certs": None if certs is None else str(certs), "tls_ca": None if tls_ca is None else str(tls_ca),
        "tls_cert": None if tls_cert is None else str(tls_cert), "tls_key": None if tls_key is None else str(tls_key),
        "tls_server_name": tls_server_name, "token_file": None if token_file is None else str(token_file),
        "reconnect_s": reconnect, "slowdown": slowdown})
    token = read_token(_path(settings.token_file))
    tls = client_tls(_path(settings.certs), settings.client_id, _path(settings.tls_ca), _path(settings.tls_cert),
                     _path(settings.tls_key), settings.tls_server_name)
    route_logging(info_by_default=False)
    try:
        own = load_client_data(settings.data, settings.client_id)
        if settings.model is not None:
            load_object(settings.model, "--model")  # a bad target fails now, not after the server answers
        client = FlClient(settings.server, settings.client_id, own, model=settings.model,
                          data_name=settings.data, attack=settings.attack, token=token, tls=tls,
                          reconnect_s=settings.reconnect_s, freeze_heap=True,
                          slowdown=None if settings.slowdown is None else parse_slowdown(settings.slowdown))
        summary = asyncio.run(client.run())
    except ClientStopped as e:
        raise RuntimeFailure(f"client {settings.client_id}: {e}") from None
    except UserCodeError as e:
        if e.details:
            debug(e.details.rstrip())
        raise
    except ValueError as e:  # a --data/--model SPEC that cannot be used, or data that do not fit the task
        raise UsageError(f"client {settings.client_id}: {e}") from None
    balance = "" if summary.balance is None else f"; balance {summary.balance:.6g}"
    log(f"client {settings.client_id}: done; trained in {summary.rounds_trained} rounds, {summary.accepted} "
        f"updates accepted, {summary.rejected} rejected, {summary.tokens_earned:.4g} tokens earned{balance}")
    if json_out:
        emit_json(summary.__dict__)


def main() -> None:
    run_app(app)
