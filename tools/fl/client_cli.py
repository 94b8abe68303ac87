"""fl-client command line."""
from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import typer

from mlsyskit.core.cli import fail, make_app, run_app
from mlsyskit.core.console import emit_json, log
from mlsyskit.core.rpc import ClientTls, RpcError
from mlsyskit.tools.fl.config import ATTACKS, DATASETS, check_address

app = make_app(
    "fl-client",
    "Federated learning client: registers with an fl-server, trains on its own data partition when "
    "selected and reports its update with measured quality and resource use.",
)


@app.command()
def run(server: str = typer.Option("127.0.0.1:7070", "--server", help="fl-server HOST:PORT."),
        client_id: int = typer.Option(..., "--client-id", help="This client's partition index (0..N-1)."),
        dataset: str | None = typer.Option(None, "--dataset", help="Expected dataset (checked against the server's)."),
        malicious: str = typer.Option("none", "--malicious", help="label-flip | noisy-labels | random-update"),
        tls_ca: Path | None = typer.Option(None, "--tls-ca", help="CA (PEM) that signed the server certificate."),
        tls_server_name: str | None = typer.Option(None, "--tls-server-name",
                                                   help="Name to check in the server certificate."),
        token_file: Path | None = typer.Option(None, "--token-file", help="Shared secret the server expects."),
        reconnect: float = typer.Option(30.0, "--reconnect", help="Seconds to keep trying to reach the server."),
        crash_in_round: int | None = typer.Option(None, "--crash-in-round", hidden=True,
                                                  help="Fault injection: die mid-round N (tests)."),
        json_out: bool = typer.Option(False, "--json", help="Print a JSON summary on stdout.")) -> None:
    """Join a server and take part until the job is done."""
    from mlsyskit.tools.fl.threads import pause_gc_for_startup

    pause_gc_for_startup()  # until the client is ready (FlClient(freeze_heap=True))
    from mlsyskit.tools.fl.client import ClientStopped, FlClient

    if (problem := check_address(server, "--server")) is not None:
        raise fail(problem)
    if malicious not in ATTACKS:
        raise fail(f"--malicious must be one of {', '.join(ATTACKS)}")
    if dataset is not None and dataset not in DATASETS:
        raise fail(f"--dataset must be one of {', '.join(DATASETS)}")
    token = None
    if token_file is not None:
        try:
            token = token_file.read_text().strip()
        except OSError as e:
            raise fail(f"cannot read token file {token_file}: {e.strerror}") from None
        if not token:  # an empty secret would silently send no token at all
            raise fail(f"token file {token_file} is empty")
    try:
        tls = ClientTls.from_files(tls_ca, server_name=tls_server_name) if tls_ca else None
    except RpcError as e:
        raise fail(e.message) from None
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    client = FlClient(server, client_id, dataset=dataset, attack=malicious, token=token, tls=tls,
                      reconnect_s=reconnect, exit_after_round=crash_in_round, freeze_heap=True)
    try:
        summary = asyncio.run(client.run())
    except ClientStopped as e:
        raise fail(f"client {client_id}: {e}") from None
    log(f"client {client_id}: done after training in {summary.rounds_trained} rounds "
        f"({summary.rejected} rejected)")
    if json_out:
        emit_json(summary.__dict__)


def main() -> None:
    run_app(app)
