"""Talking to a marble daemon: where it is (daemon.json in its state dir, or flags) and one call per command.

Errors become the suite's exit codes: the daemon refusing a request (bad spec, unknown job) is a
usage error (2); an unreachable daemon or a failed call is a runtime failure (1).

This module is on every client command's path, so it imports only what a call needs (no policy,
model or job table): a client command answers in a fraction of a second.
"""
from __future__ import annotations

import asyncio
import getpass
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlsyskit.core.errors import RuntimeFailure, UsageError
from mlsyskit.core.retry import retry_async
from mlsyskit.core.rpc import ClientTls, RpcClient, RpcError, StatusCode
from mlsyskit.tools.sched.daemon.files import SERVICE, DaemonFiles, default_user_token_file

_USAGE_CODES = (StatusCode.INVALID_ARGUMENT, StatusCode.NOT_FOUND, StatusCode.FAILED_PRECONDITION)
# A call that timed out on a busy machine is tried again (reads always; a submit with its key, which
# the daemon uses to answer a repeat with the jobs the first try made). A refused connection is not:
# no daemon there is said at once.
RETRY_FOR_S = 90.0


def _retriable(error: BaseException) -> bool:
    return isinstance(error, RpcError) and error.code == StatusCode.DEADLINE_EXCEEDED


def _read_secret(path: Path, what: str) -> str:
    try:
        return path.read_text().strip()
    except OSError as e:
        raise UsageError(f"cannot read {what} {path}: {e.strerror}") from None


@dataclass(frozen=True)
class Endpoint:
    address: str
    token: str
    tls_ca: Path | None
    user_token: str = ""

    @classmethod
    def resolve(cls, state_dir: Path, address: str | None = None, token_file: Path | None = None,
                tls_ca: Path | None = None, user_token_file: Path | None = None) -> Endpoint:
        """Flags first, then the daemon's daemon.json in `state_dir`. A daemon with users asks for no
        shared secret but for the caller's own token (--user-token-file, else ~/.config/marble/token)."""
        info: dict[str, Any] = {}
        files = DaemonFiles(state_dir)
        if files.info.exists():
            try:
                info = json.loads(files.info.read_text())
            except (OSError, ValueError) as e:
                raise RuntimeFailure(f"cannot read {files.info}: {e}") from None
        elif address is None:
            raise RuntimeFailure(f"no marble daemon found: {files.info} does not exist "
                                 "(start one with `marble serve`, or pass --addr and --token-file)")
        address = address or info.get("address")
        token = ""
        if token_file is not None or not info.get("users"):
            token = _read_secret(token_file or Path(info.get("token_file") or files.token), "token file")
        user_token = ""
        own = user_token_file or default_user_token_file()
        if user_token_file is not None or (info.get("users") and own.exists()):   # only to a daemon with users
            user_token = _read_secret(own, "user token file")
        ca = tls_ca or (Path(info["tls_ca"]) if info.get("tls_ca") else None)
        return cls(address, token, ca, user_token)


class DaemonClient:
    def __init__(self, endpoint: Endpoint, timeout: float = 30.0) -> None:
        self.endpoint, self.timeout = endpoint, timeout

    def call(self, method: str, payload: dict | None = None, retry_for: float = 0.0) -> Any:
        """One call; with `retry_for`, tries that time out are repeated until that many seconds pass."""
        payload = {**(payload or {}), "caller": _login()}
        if self.endpoint.user_token:
            payload["user_token"] = self.endpoint.user_token
        return asyncio.run(self._call(method, payload, retry_for))

    async def _call(self, method: str, payload: dict, retry_for: float) -> Any:
        try:
            tls = ClientTls.from_files(self.endpoint.tls_ca) if self.endpoint.tls_ca else None
            async with RpcClient(self.endpoint.address, token=self.endpoint.token or None, tls=tls, service=SERVICE,
                                 timeout=self.timeout) as rpc:
                return await retry_async(lambda: rpc.call(method, payload), retriable=_retriable, deadline_s=retry_for)
        except RpcError as e:
            if e.code in _USAGE_CODES:
                raise UsageError(_strip(e.message)) from None
            raise RuntimeFailure(f"marble daemon: {e.message}") from None


def _login() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):   # no name for this uid (e.g. a container)
        return ""


def _strip(message: str) -> str:
    """'submit on 127.0.0.1:5: job spec: gpus: ...' -> 'job spec: gpus: ...'."""
    head, sep, rest = message.partition(": ")
    return rest if sep and " on " in head else message
