"""What fl-server and fl-client share on the command line: secrets, TLS files, and log routing.

TLS comes either from one folder written by `fl-server certs DIR` (ca.pem, server.pem/.key,
client-<ID>.pem/.key) or from explicit files; a folder means mutual TLS, so each client is known
by its certificate. Library log records (joins, selections, receipts ...) go to the suite's
stderr console, so -v / -q mean the same as in every other command.
"""
from __future__ import annotations

import logging
from pathlib import Path

from mlsyskit.core import console
from mlsyskit.core.errors import UsageError
from mlsyskit.core.rpc import ClientTls, RpcError, ServerTls
from mlsyskit.core.rpc_tls import client_paths


def read_token(path: Path | None) -> str | None:
    if path is None:
        return None
    try:
        token = Path(path).read_text().strip()
    except OSError as e:
        raise UsageError(f"cannot read token file {path}: {e.strerror}") from None
    if not token:  # an empty secret would silently send no token at all
        raise UsageError(f"token file {path} is empty")
    return token


def _existing(path: Path, what: str) -> Path:
    if not path.is_file():
        raise UsageError(f"{what} {path} does not exist (make it with: fl-server certs {path.parent})")
    return path


def server_tls(certs: Path | None, cert: Path | None, key: Path | None, client_ca: Path | None) -> ServerTls | None:
    """--certs DIR (mutual TLS with DIR/ca.pem as the client CA), or --tls-cert/--tls-key[/--tls-client-ca]."""
    if certs is not None and (cert or key or client_ca):
        raise UsageError("--certs replaces --tls-cert/--tls-key/--tls-client-ca; give one or the other")
    if certs is not None:
        cert, key, client_ca = (_existing(certs / name, "certificate file")
                                for name in ("server.pem", "server.key", "ca.pem"))
    if (cert is None) != (key is None):
        raise UsageError("--tls-cert and --tls-key go together")
    if cert is None:
        if client_ca is not None:
            raise UsageError("--tls-client-ca needs --tls-cert and --tls-key")
        return None
    try:
        return ServerTls.from_files(cert, key, client_ca)
    except RpcError as e:
        raise UsageError(e.message) from None


def client_tls(certs: Path | None, client_id: int, ca: Path | None, cert: Path | None, key: Path | None,
               server_name: str | None) -> ClientTls | None:
    """--certs DIR (DIR/ca.pem and DIR/client-<ID>.pem/.key), or --tls-ca[/--tls-cert/--tls-key]."""
    if certs is not None and (ca or cert or key):
        raise UsageError("--certs replaces --tls-ca/--tls-cert/--tls-key; give one or the other")
    if certs is not None:
        ca = _existing(certs / "ca.pem", "certificate file")
        cert, key = (_existing(p, f"client {client_id}'s certificate file") for p in client_paths(certs, str(client_id)))
    if (cert is None) != (key is None):
        raise UsageError("--tls-cert and --tls-key go together")
    if ca is None:
        if cert is not None or server_name is not None:
            raise UsageError("--tls-cert/--tls-key/--tls-server-name need --tls-ca (or --certs DIR)")
        return None
    try:
        return ClientTls.from_files(ca, cert, key, server_name)
    except RpcError as e:
        raise UsageError(e.message) from None


class _ConsoleHandler(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if record.levelno >= logging.WARNING:
            console.warn(message)
        elif record.levelno >= logging.INFO:
            console.log(message)
        else:
            console.debug(message)


def route_logging(info_by_default: bool) -> None:
    """Send mlsyskit log records to the console. Info lines show by default (server: joins, selections,
    pay) or only with -v (client: selection, receipts, balance per round); -q keeps warnings."""
    root = logging.getLogger("mlsyskit")
    root.handlers[:] = [_ConsoleHandler()]
    root.propagate = False
    if console.is_quiet():
        root.setLevel(logging.WARNING)
    elif console.is_verbose():
        root.setLevel(logging.DEBUG)
    else:
        root.setLevel(logging.INFO if info_by_default else logging.WARNING)
