"""Talking to a marble daemon: where it is (daemon.json in its state dir, or flags) and one call per command.

Errors become the suite's exit codes: the daemon refusing a request (bad spec, unknown job) is a
usage error (2); an unreachable daemon or a failed call is a runtime failure (1).
"""
from __future__ import annotations

import asyncio
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlsyskit.core.errors import RuntimeFailure, UsageError
from mlsyskit.core.rpc import ClientTls, RpcClient, RpcError, StatusCode
from mlsyskit.tools.sched.daemon.service import SERVICE, DaemonFiles

_USAGE_CODES = (StatusCode.INVALID_ARGUMENT, StatusCode.NOT_FOUND, StatusCode.FAILED_PRECONDITION)


def default_state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "marble"


@dataclass(frozen=True)
class Endpoint:
    address: str
    token: str
    tls_ca: Path | None

    @classmethod
    def resolve(cls, state_dir: Path, address: str | None = None, token_file: Path | None = None,
                tls_ca: Path | None = None) -> Endpoint:
        """Flags first, then the daemon's daemon.json in `state_dir`."""
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
        token_path = token_file or Path(info.get("token_file") or files.token)
        try:
            token = token_path.read_text().strip()
        except OSError as e:
            raise UsageError(f"cannot read token file {token_path}: {e.strerror}") from None
        ca = tls_ca or (Path(info["tls_ca"]) if info.get("tls_ca") else None)
        return cls(address, token, ca)


class DaemonClient:
    def __init__(self, endpoint: Endpoint, timeout: float = 30.0) -> None:
        self.endpoint, self.timeout = endpoint, timeout

    def call(self, method: str, payload: dict | None = None) -> Any:
        return asyncio.run(self._call(method, payload or {}))

    async def _call(self, method: str, payload: dict) -> Any:
        try:
            tls = ClientTls.from_files(self.endpoint.tls_ca) if self.endpoint.tls_ca else None
            async with RpcClient(self.endpoint.address, token=self.endpoint.token, tls=tls, service=SERVICE,
                                 timeout=self.timeout) as rpc:
                return await rpc.call(method, payload)
        except RpcError as e:
            if e.code in _USAGE_CODES:
                raise UsageError(_strip(e.message)) from None
            raise RuntimeFailure(f"marble daemon: {e.message}") from None


def _strip(message: str) -> str:
    """'submit on 127.0.0.1:5: job spec: gpus: ...' -> 'job spec: gpus: ...'."""
    head, sep, rest = message.partition(": ")
    return rest if sep and " on " in head else message
