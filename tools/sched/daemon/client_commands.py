"""What the daemon's client commands do (submit, status, queue, history, cancel, logs, nodes), as plain
functions of their parsed options: commands.py puts them on the typer app (help, usage errors) and
client_cli.py runs them straight from sys.argv, without building the typer app, when a command line
is plain enough to parse without it. Both call the functions below, so a command does the same
either way.

Only the RPC client and plain-text tables are imported here: no typer, pydantic, rich, policy,
model or simulator.
"""
from __future__ import annotations

import secrets
import sys
import time
from pathlib import Path
from typing import Any

from mlsyskit.core.errors import UsageError
from mlsyskit.tools.sched.daemon import tables
from mlsyskit.tools.sched.daemon.client import RETRY_FOR_S, DaemonClient, Endpoint
from mlsyskit.tools.sched.daemon.files import default_state_dir


def _client(state_dir: Path | None, addr: str | None, token_file: Path | None, tls_ca: Path | None,
            user_token_file: Path | None) -> DaemonClient:
    return DaemonClient(Endpoint.resolve(state_dir or default_state_dir(), addr, token_file, tls_ca, user_token_file))


def note(message: str) -> None:
    """A line for the person at the terminal (stderr; none when stderr is not a terminal)."""
    if sys.stderr.isatty():
        sys.stderr.write(message + "\n")


def _count(flag: str, text: str | None) -> int | None:
    """A GPU or node count from a flag, refusing fractions by name."""
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        try:
            value = float(text)
        except ValueError:
            raise UsageError(f"{flag} {text!r}: expected a whole number") from None
        raise UsageError(f"{flag} {value:g}: GPUs and nodes are whole numbers (fractional GPUs are not supported)") \
            from None


def _emit_json(doc: Any) -> None:
    import json

    tables.write(json.dumps(doc, indent=2, sort_keys=True, default=str) + "\n")


def submit(*, job_file: Path | None, cmd: str | None, app_name: str | None, gpus: str | None, min_gpus: str | None,
           max_gpus: str | None, name: str | None, batch_size: str | None, time_limit: str | None,
           dependency: str | None, array: str | None, nodes: str | None, workdir: Path | None,
           state_dir: Path | None, addr: str | None, token_file: Path | None, tls_ca: Path | None,
           user_token_file: Path | None, as_json: bool) -> None:
    data: dict[str, Any] = {}
    if job_file:
        from mlsyskit.tools.sched.daemon.specs import read_job_file

        data = dict(read_job_file(job_file))
    array = array if array is not None else data.pop("array", None)
    flags = {"cmd": cmd, "app": app_name, "gpus": _count("--gpus", gpus), "min_gpus": _count("--min-gpus", min_gpus),
             "max_gpus": _count("--max-gpus", max_gpus), "name": name,
             "batch_size": _count("--batch-size", batch_size), "time": time_limit, "dependency": dependency,
             "nodes": _count("--nodes", nodes)}
    data.update({k: v for k, v in flags.items() if v is not None})
    data.setdefault("workdir", str((workdir or Path.cwd()).absolute()))
    payload = {"job": data, "key": secrets.token_hex(16), **({"array": str(array)} if array is not None else {})}
    try:
        job = _client(state_dir, addr, token_file, tls_ca, user_token_file).call("submit", payload, RETRY_FOR_S)
    except Exception:
        # The daemon checks the spec with the same job_from_mapping (and more: known apps, what fits), so a
        # spec it takes passes here too: checked only when the submit failed (no daemon, refused, a value
        # that cannot be sent), a bad field is said in the job file's words before any other error, as
        # when it was checked before the call. (pydantic's check costs ~0.3 s of CPU per submit.)
        from mlsyskit.tools.sched.daemon.specs import job_from_mapping, parse_array

        where = str(job_file) if job_file else "job"
        job_from_mapping(data, where=where)
        if array is not None:
            try:
                parse_array(str(array))
            except ValueError as e:
                raise UsageError(f"{where}: {e}") from None
        raise
    if as_json:
        _emit_json(job)
        return
    ids = job.get("ids") or [job["id"]]
    note(f"job {ids[0]} queued ({job['name']})" if len(ids) == 1 else
         f"array of {len(ids)} jobs queued: {ids[0]}-{ids[-1]} ({job['name']})")
    tables.write("".join(f"{i}\n" for i in ids))


def status(*, job: int | None, state_dir: Path | None, addr: str | None, token_file: Path | None,
           tls_ca: Path | None, user_token_file: Path | None, as_json: bool) -> None:
    jobs = _client(state_dir, addr, token_file, tls_ca, user_token_file).call("status", {"job": job}, RETRY_FOR_S)["jobs"]
    _emit_json(jobs) if as_json else tables.write(tables.jobs_table(jobs))


def queue(*, state_dir: Path | None, addr: str | None, token_file: Path | None, tls_ca: Path | None,
          user_token_file: Path | None, as_json: bool) -> None:
    jobs = _client(state_dir, addr, token_file, tls_ca, user_token_file).call("queue", None, RETRY_FOR_S)["jobs"]
    _emit_json(jobs) if as_json else tables.write(tables.jobs_table(jobs))


def history(*, user: str | None, every: bool, limit: int, state_dir: Path | None, addr: str | None,
            token_file: Path | None, tls_ca: Path | None, user_token_file: Path | None, as_json: bool) -> None:
    payload = {"user": user, "all": every, "limit": limit}
    jobs = [tables.history_row(j) for j in
            _client(state_dir, addr, token_file, tls_ca, user_token_file).call("history", payload, RETRY_FOR_S)["jobs"]]
    _emit_json(jobs) if as_json else tables.write(tables.history_table(jobs))


def cancel(*, jobs: list[int] | None, name: str | None, user: str | None, state_dir: Path | None, addr: str | None,
           token_file: Path | None, tls_ca: Path | None, user_token_file: Path | None, as_json: bool) -> None:
    if not jobs and name is None and user is None:
        raise UsageError("cancel: give job ids, --name or --user")
    payload = {"jobs": list(jobs or []), "name": name, "user": user}
    results = _client(state_dir, addr, token_file, tls_ca, user_token_file).call("cancel", payload)["results"]
    if as_json:
        _emit_json(results)
    else:
        for r in results:
            note(f"job {r['id']}: {r['state']}" if r["error"] is None else f"job {r['id']}: {r['error']}")
        if not results:
            note("no queued or running job matched")
    failed = [r["error"] for r in results if r["error"]]
    if failed:
        raise UsageError("; ".join(failed))


def logs(*, job: int, follow: bool, state_dir: Path | None, addr: str | None, token_file: Path | None,
         tls_ca: Path | None, user_token_file: Path | None) -> None:
    client = _client(state_dir, addr, token_file, tls_ca, user_token_file)
    offset = 0
    while True:
        chunk = client.call("logs", {"job": job, "offset": offset}, RETRY_FOR_S)
        sys.stdout.buffer.write(chunk["data"])
        sys.stdout.flush()
        offset = chunk["offset"]
        if not follow or chunk["ended"]:
            break
        if not chunk["data"]:
            time.sleep(0.5)  # polling for new output, not synchronising


def nodes(*, state_dir: Path | None, addr: str | None, token_file: Path | None, tls_ca: Path | None,
          user_token_file: Path | None, as_json: bool) -> None:
    rows = _client(state_dir, addr, token_file, tls_ca, user_token_file).call("nodes", None, RETRY_FOR_S)["nodes"]
    if as_json:
        _emit_json(rows)
        return
    tables.write(tables.render([("NODE", 4), ("HOST", 4), ("GPUS", 0), ("USED", 0), ("FREE", 0), ("DEVICE:JOB", 10)],
                               [[r["node"], r["host"], str(r["gpus"]), str(r["used"]), str(r["free"]),
                                 " ".join(f"{d}:{j if j is not None else '-'}" for d, j in r["devices"].items())]
                                for r in rows]))


__all__ = ["cancel", "history", "logs", "nodes", "note", "queue", "status", "submit"]
