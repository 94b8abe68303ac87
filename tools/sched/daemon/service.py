"""`marble serve`: the scheduler behind a gRPC API (core rpc: msgpack, shared-secret token, optional TLS).

The state directory holds everything the daemon needs to come back after a crash:
    jobs.db       the job table (SQLite, WAL)          jobs/<id>/    each job's log, pid and exit files
    token         the shared secret (0600)             daemon.json   address, pid, TLS CA for local clients
    daemon.lock   held (flock) while a daemon runs: a second daemon on the same state refuses to start,
                  since two would launch the same queued jobs.
Stopping the daemon (SIGTERM, Ctrl-C) leaves running jobs running; the next daemon re-attaches them.
"""
from __future__ import annotations

import asyncio
import fcntl
import json
import os
import secrets
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlsyskit.core.config import ConfigError
from mlsyskit.core.errors import RuntimeFailure, UsageError
from mlsyskit.core.rpc import CallContext, RpcError, RpcServer, ServerTls, StatusCode
from mlsyskit.tools.sched.daemon.jobstore import ACTIVE, FINAL, QUEUED, UnknownJobError
from mlsyskit.tools.sched.daemon.scheduler import Scheduler
from mlsyskit.tools.sched.daemon.specs import job_from_mapping

SERVICE = "marble"
LOG_CHUNK = 1 << 20


@dataclass(frozen=True)
class DaemonFiles:
    state_dir: Path

    @property
    def db(self) -> Path:
        return self.state_dir / "jobs.db"

    @property
    def token(self) -> Path:
        return self.state_dir / "token"

    @property
    def info(self) -> Path:
        return self.state_dir / "daemon.json"

    @property
    def lock(self) -> Path:
        return self.state_dir / "daemon.lock"

    @property
    def tls_dir(self) -> Path:
        return self.state_dir / "tls"


def lock_state_dir(files: DaemonFiles) -> int:
    """Hold the state directory for this process (released when it exits, even by SIGKILL)."""
    fd = os.open(files.lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        owner = files.info.read_text() if files.info.exists() else "unknown"
        raise RuntimeFailure(f"another marble daemon holds {files.state_dir} ({owner.strip()}); "
                             "stop it or use another --state-dir") from None
    return fd


def ensure_token(files: DaemonFiles, token_file: Path | None) -> tuple[str, Path]:
    """The shared secret: from `token_file`, else the state dir's (made on first start)."""
    path = token_file or files.token
    if token_file is None and not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(32) + "\n")
    try:
        token = path.read_text().strip()
    except OSError as e:
        raise UsageError(f"cannot read token file {path}: {e.strerror}") from None
    if not token:
        raise UsageError(f"token file {path} is empty")
    return token, path


def _write_json(path: Path, doc: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n")
    os.replace(tmp, path)


class DaemonService:
    """RPC handlers: each runs the scheduler's (blocking, locked) method in a worker thread."""

    def __init__(self, scheduler: Scheduler, info: dict[str, Any]) -> None:
        self.scheduler, self.store, self.info = scheduler, scheduler.store, info

    def register(self, server: RpcServer) -> None:
        for name in ("submit", "status", "queue", "cancel", "logs", "nodes", "info"):
            server.unary(name, self._handler(getattr(self, f"_{name}")))

    def _handler(self, fn: Callable[[Any], Any]):
        async def handle(payload: Any, call: CallContext) -> Any:
            try:
                return await asyncio.to_thread(fn, payload if isinstance(payload, dict) else {})
            except UnknownJobError as e:
                raise RpcError(StatusCode.NOT_FOUND, str(e)) from None
            except (UsageError, ConfigError, KeyError) as e:
                raise RpcError(StatusCode.INVALID_ARGUMENT, str(e.args[0]) if isinstance(e, KeyError) else str(e)) \
                    from None
        return handle

    def _job_id(self, payload: dict) -> int:
        job = payload.get("job")
        if not isinstance(job, int) or isinstance(job, bool):
            raise UsageError(f"job: expected a job id (an integer), got {job!r}")
        return job

    def _submit(self, payload: dict) -> dict:
        request = job_from_mapping(payload.get("job"), self.scheduler.model.apps, where="job spec")
        return self.scheduler.describe(self.scheduler.submit(request))

    def _status(self, payload: dict) -> dict:
        if payload.get("job") is None:
            return {"jobs": [self.scheduler.describe(j) for j in self.store.jobs()]}
        return {"jobs": [self.scheduler.describe(self.store.get(self._job_id(payload)))]}

    def _queue(self, payload: dict) -> dict:
        return {"jobs": [self.scheduler.describe(j) for j in self.store.jobs((QUEUED, *ACTIVE))]}

    def _cancel(self, payload: dict) -> dict:
        return self.scheduler.describe(self.scheduler.cancel(self._job_id(payload)))

    def _logs(self, payload: dict) -> dict:
        job = self.store.get(self._job_id(payload))
        offset = payload.get("offset", 0)
        if not isinstance(offset, int) or offset < 0:
            raise UsageError(f"offset: expected a non-negative integer, got {offset!r}")
        path = self.scheduler.launch_of(job).log_path
        ended = job.state in FINAL
        try:
            with path.open("rb") as f:
                f.seek(offset)
                data = f.read(LOG_CHUNK)
        except FileNotFoundError:
            data = b""
        more = len(data) == LOG_CHUNK
        return {"data": data, "offset": offset + len(data), "ended": ended and not more, "state": job.state}

    def _nodes(self, payload: dict) -> dict:
        return {"nodes": self.scheduler.nodes()}

    def _info(self, payload: dict) -> dict:
        return self.info


async def run_daemon(scheduler: Scheduler, files: DaemonFiles, address: str, token: tuple[str, Path],
                     tls: ServerTls | None,
                     tls_ca: Path | None, poll_interval_s: float, info: dict[str, Any],
                     log: Callable[[str], None]) -> None:
    """Serve until SIGTERM/SIGINT; run `scheduler.step()` every `poll_interval_s`."""
    scheduler.recover()
    server = RpcServer(address, token=token[0], tls=tls, service=SERVICE)
    DaemonService(scheduler, info).register(server)
    try:
        port = await server.start()
    except RpcError as e:
        raise RuntimeFailure(e.message) from None
    host = address.rsplit(":", 1)[0]
    _write_json(files.info, {"address": f"{host}:{port}", "pid": os.getpid(), "tls_ca": str(tls_ca) if tls_ca else None,
                             "token_file": str(token[1])})
    log(f"marble daemon on {host}:{port} ({'TLS' if tls else 'plain, loopback'}); state in {files.state_dir}")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        while not stop.is_set():
            await asyncio.to_thread(scheduler.step)
            try:
                await asyncio.wait_for(stop.wait(), poll_interval_s)
            except TimeoutError:
                pass
    finally:
        await server.stop(grace=1.0)
        log("marble daemon stopped; running jobs keep running and are re-attached by the next daemon")
