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
from pathlib import Path
from typing import Any

from mlsyskit.core.config import ConfigError
from mlsyskit.core.errors import RuntimeFailure, UsageError
from mlsyskit.core.rpc import CallContext, RpcError, RpcServer, ServerTls, StatusCode
from mlsyskit.tools.sched.daemon.files import SERVICE, DaemonFiles
from mlsyskit.tools.sched.daemon.jobstore import ACTIVE, FINAL, QUEUED, UnknownJobError
from mlsyskit.tools.sched.daemon.scheduler import Scheduler
from mlsyskit.tools.sched.daemon.specs import job_from_mapping, parse_array
from mlsyskit.tools.sched.daemon.users import NAME, Users

LOG_CHUNK = 1 << 20
MAX_HISTORY = 10_000


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
    """RPC handlers: each runs the scheduler's (blocking, locked) method in a worker thread.

    Every handler learns who calls (`_caller`): the client certificate's name, else the owner of
    the user token in the payload (with --users), else the name the client gives."""

    def __init__(self, scheduler: Scheduler, info: dict[str, Any], users: Users | None = None) -> None:
        self.scheduler, self.store, self.info, self.users = scheduler, scheduler.store, info, users

    def register(self, server: RpcServer) -> None:
        for name in ("submit", "status", "queue", "cancel", "logs", "nodes", "info", "history"):
            server.unary(name, self._handler(getattr(self, f"_{name}")))

    def _handler(self, fn: Callable[[dict, tuple[str, bool]], Any]):
        async def handle(payload: Any, call: CallContext) -> Any:
            payload = payload if isinstance(payload, dict) else {}
            caller = self._caller(payload, call)
            try:
                return await asyncio.to_thread(fn, payload, caller)
            except UnknownJobError as e:
                raise RpcError(StatusCode.NOT_FOUND, str(e)) from None
            except (UsageError, ConfigError, KeyError) as e:
                raise RpcError(StatusCode.INVALID_ARGUMENT, str(e.args[0]) if isinstance(e, KeyError) else str(e)) \
                    from None
        return handle

    def _caller(self, payload: dict, call: CallContext) -> tuple[str, bool]:
        """(user name, may act on anyone's jobs)."""
        if self.users is None:
            claimed = payload.get("caller")
            name = claimed if isinstance(claimed, str) and NAME.fullmatch(claimed) else ""
            return call.identity or name, True
        if call.identity:
            known = self.users.get(call.identity)
            return call.identity, bool(known and known.admin)
        user = self.users.identify(payload.get("user_token"))
        if user is None:
            raise RpcError(StatusCode.UNAUTHENTICATED, "this daemon serves its users only: no valid user token "
                                                       "(--user-token-file, default ~/.config/marble/token)")
        return user.name, user.admin

    def _job_id(self, payload: dict) -> int:
        job = payload.get("job")
        if not isinstance(job, int) or isinstance(job, bool):
            raise UsageError(f"job: expected a job id (an integer), got {job!r}")
        return job

    def _submit(self, payload: dict, caller: tuple[str, bool]) -> dict:
        request = job_from_mapping(payload.get("job"), self.scheduler.model.apps, where="job spec")
        array = payload.get("array") or ""
        if not isinstance(array, str):
            raise UsageError(f"array: expected a range like 0-9, got {array!r}")
        try:
            tasks = parse_array(array) if array else ()
        except ValueError as e:
            raise UsageError(str(e)) from None
        key = payload.get("key")
        if key is not None and not (isinstance(key, str) and 8 <= len(key) <= 64):
            raise UsageError("key: expected a submit key of 8..64 characters")
        jobs = self.scheduler.submit_all(request, caller[0], tasks, key)
        return {**self.scheduler.describe(jobs[0]), "ids": [j.id for j in jobs]}

    def _status(self, payload: dict, caller: tuple[str, bool]) -> dict:
        if payload.get("job") is None:
            return {"jobs": [self.scheduler.describe(j) for j in self.store.jobs()]}
        return {"jobs": [self.scheduler.describe(self.store.get(self._job_id(payload)))]}

    def _queue(self, payload: dict, caller: tuple[str, bool]) -> dict:
        return {"jobs": [self.scheduler.describe(j) for j in self.store.jobs((QUEUED, *ACTIVE))]}

    def _history(self, payload: dict, caller: tuple[str, bool]) -> dict:
        """Ended jobs (all jobs with `all`), newest last, optionally of one user, at most `limit`."""
        user, limit = payload.get("user"), payload.get("limit", 1000)
        if not isinstance(limit, int) or not 1 <= limit <= MAX_HISTORY:
            raise UsageError(f"limit: expected 1..{MAX_HISTORY}, got {limit!r}")
        jobs = self.store.jobs(None if payload.get("all") else FINAL)
        rows = [self.scheduler.describe(j) for j in jobs if user is None or j.user == user][-limit:]
        return {"jobs": rows}

    def _cancel(self, payload: dict, caller: tuple[str, bool]) -> dict:
        """Cancel jobs by id (`jobs`), by `name` and/or by `user`; one result per job."""
        ids, name, user = payload.get("jobs", []), payload.get("name"), payload.get("user")
        if "job" in payload:
            ids = [self._job_id(payload)]
        if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            raise UsageError(f"jobs: expected a list of job ids, got {ids!r}")
        if not ids and name is None and user is None:
            raise UsageError("cancel: give job ids, --name or --user")
        if user is not None and user != caller[0] and not caller[1]:
            raise UsageError(f"user {caller[0]} may not cancel the jobs of {user}")
        targets = [self.store.get(i) for i in ids]
        if name is not None or user is not None:
            live = self.store.jobs((QUEUED, *ACTIVE))
            targets += [j for j in live if (name is None or j.name == name or j.request.name == name)
                        and (user is None or j.user == user) and j.id not in ids]
        results = []
        for job in targets:
            if job.user != caller[0] and not caller[1]:
                results.append({"id": job.id, "state": job.state, "error": f"job {job.id} belongs to {job.user}"})
                continue
            try:
                results.append({"id": job.id, "state": self.scheduler.cancel(job.id).state, "error": None})
            except UsageError as e:
                results.append({"id": job.id, "state": job.state, "error": str(e)})
        return {"results": results}

    def _logs(self, payload: dict, caller: tuple[str, bool]) -> dict:
        job = self.store.get(self._job_id(payload))
        if job.user != caller[0] and not caller[1]:
            raise UsageError(f"job {job.id}'s output is {job.user}'s")
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

    def _nodes(self, payload: dict, caller: tuple[str, bool]) -> dict:
        return {"nodes": self.scheduler.nodes()}

    def _info(self, payload: dict, caller: tuple[str, bool]) -> dict:
        return {**self.info, "user": caller[0], "admin": caller[1]}


async def run_daemon(scheduler: Scheduler, files: DaemonFiles, address: str, token: tuple[str, Path],
                     tls: ServerTls | None,
                     tls_ca: Path | None, poll_interval_s: float, info: dict[str, Any],
                     log: Callable[[str], None], users: Users | None = None) -> None:
    """Serve until SIGTERM/SIGINT; run `scheduler.step()` every `poll_interval_s`. With `users`,
    the shared secret is not asked for: every call must prove its user instead."""
    scheduler.recover()
    server = RpcServer(address, token=None if users else token[0], tls=tls, service=SERVICE)
    DaemonService(scheduler, info, users).register(server)
    try:
        port = await server.start()
    except RpcError as e:
        raise RuntimeFailure(e.message) from None
    host = address.rsplit(":", 1)[0]
    _write_json(files.info, {"address": f"{host}:{port}", "pid": os.getpid(), "tls_ca": str(tls_ca) if tls_ca else None,
                             "token_file": str(token[1]), "users": users is not None})
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
