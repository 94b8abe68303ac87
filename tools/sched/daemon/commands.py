"""The daemon's client commands on the `marble` app: submit, status, queue, cancel, history, logs,
nodes, adduser (and serve and profile from their own modules).

Clients find the daemon through its state directory (daemon.json + token, written by `serve`),
or --addr/--token-file/--tls-ca; MLSYSKIT_MARBLE_STATE_DIR and MLSYSKIT_MARBLE_ADDR set them for
every command. A daemon with users (serve --users) wants each caller's own token instead
(--user-token-file, default ~/.config/marble/token).

Client commands import only the RPC client and plain-text tables (tables.py): no policy, model,
simulator or rich, so each answers in a fraction of a second.
"""
from __future__ import annotations

import secrets
import sys
import time
from pathlib import Path
from typing import Any

import typer

from mlsyskit.core.cli import json_option
from mlsyskit.core.errors import UsageError
from mlsyskit.tools.sched.daemon import tables
from mlsyskit.tools.sched.daemon.client import RETRY_FOR_S, DaemonClient, Endpoint
from mlsyskit.tools.sched.daemon.files import default_state_dir
from mlsyskit.tools.sched.daemon.profile_command import register_profile
from mlsyskit.tools.sched.daemon.serve_command import register_serve


def state_dir_option() -> Any:
    return typer.Option(None, "--state-dir", envvar="MLSYSKIT_MARBLE_STATE_DIR",
                        help="The daemon's folder (job table, logs, token, daemon.json); "
                             "default $XDG_STATE_HOME/marble or ~/.local/state/marble.")


def _addr_option() -> Any:
    return typer.Option(None, "--addr", envvar="MLSYSKIT_MARBLE_ADDR", help="HOST:PORT of the daemon (default: daemon.json).")


def _token_option() -> Any:
    return typer.Option(None, "--token-file", help="The daemon's shared secret (default: from daemon.json).")


def _ca_option() -> Any:
    return typer.Option(None, "--tls-ca", help="CA that signed the daemon's TLS certificate (default: from daemon.json).")


def _user_token_option() -> Any:
    return typer.Option(None, "--user-token-file", envvar="MLSYSKIT_MARBLE_USER_TOKEN_FILE",
                        help="Your own token for a daemon with users (default ~/.config/marble/token if present).")


def _client(state_dir: Path | None, addr: str | None, token_file: Path | None, tls_ca: Path | None,
            user_token_file: Path | None) -> DaemonClient:
    return DaemonClient(Endpoint.resolve(state_dir or default_state_dir(), addr, token_file, tls_ca, user_token_file))


def _note(message: str) -> None:
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


def register(app: typer.Typer) -> None:
    @app.command()
    def submit(
        job_file: Path | None = typer.Argument(None, help="job.toml (cmd, app, gpus, min_gpus, max_gpus, name, time, "
                                                          "dependency, nodes, array, ...)."),
        cmd: str | None = typer.Option(None, "--cmd", help="Shell command to run."),
        app_name: str | None = typer.Option(None, "--app", help="Application the throughput model knows (marble model)."),
        gpus: str | None = typer.Option(None, "--gpus", "-G", help="GPUs the job runs on (exact unless --min-gpus)."),
        min_gpus: str | None = typer.Option(None, "--min-gpus", help="Fewest GPUs it can run on: opts into elasticity "
                                                                      "(the policy sizes it between this and --gpus)."),
        max_gpus: str | None = typer.Option(None, "--max-gpus", help="Most GPUs it can use (default --gpus)."),
        name: str | None = typer.Option(None, "--name", "-J", help="A name to show (and to cancel by)."),
        batch_size: str | None = typer.Option(None, "--batch-size", help="Global batch (default: per app)."),
        time_limit: str | None = typer.Option(None, "--time", "-t", help="Wall-time limit: MM, MM:SS, HH:MM:SS, "
                                                                         "D-HH[:MM[:SS]]; stopped when reached (timeout)."),
        dependency: str | None = typer.Option(None, "--dependency", "-d", help="afterok:ID[:ID...]: start once those "
                                                                               "jobs (every task of an array) are done."),
        array: str | None = typer.Option(None, "--array", "-a", help="Job array: 0-9, 1,3,5-7 or 0-20:5; each task "
                                                                     "gets MARBLE_ARRAY_TASK_ID."),
        nodes: str | None = typer.Option(None, "--nodes", "-N", help="At most this many nodes."),
        workdir: Path | None = typer.Option(None, "--workdir", help="Working directory (default: this one)."),
        state_dir: Path | None = state_dir_option(), addr: str | None = _addr_option(),
        token_file: Path | None = _token_option(), tls_ca: Path | None = _ca_option(),
        user_token_file: Path | None = _user_token_option(), as_json: bool = json_option(),
    ) -> None:
        """Queue a job (or an array of jobs) from job.toml or flags (flags override the file); prints its id."""
        from mlsyskit.tools.sched.daemon.specs import job_from_mapping, parse_array, read_job_file

        data: dict[str, Any] = dict(read_job_file(job_file)) if job_file else {}
        array = array if array is not None else data.pop("array", None)
        flags = {"cmd": cmd, "app": app_name, "gpus": _count("--gpus", gpus), "min_gpus": _count("--min-gpus", min_gpus),
                 "max_gpus": _count("--max-gpus", max_gpus), "name": name,
                 "batch_size": _count("--batch-size", batch_size), "time": time_limit, "dependency": dependency,
                 "nodes": _count("--nodes", nodes)}
        data.update({k: v for k, v in flags.items() if v is not None})
        data.setdefault("workdir", str((workdir or Path.cwd()).absolute()))
        where = str(job_file) if job_file else "job"
        job_from_mapping(data, where=where)  # field errors before any network
        if array is not None:
            try:
                parse_array(str(array))
            except ValueError as e:
                raise UsageError(f"{where}: {e}") from None
        payload = {"job": data, "key": secrets.token_hex(16), **({"array": str(array)} if array is not None else {})}
        job = _client(state_dir, addr, token_file, tls_ca, user_token_file).call("submit", payload, RETRY_FOR_S)
        if as_json:
            _emit_json(job)
            return
        ids = job.get("ids") or [job["id"]]
        _note(f"job {ids[0]} queued ({job['name']})" if len(ids) == 1 else
              f"array of {len(ids)} jobs queued: {ids[0]}-{ids[-1]} ({job['name']})")
        tables.write("".join(f"{i}\n" for i in ids))

    @app.command()
    def status(job: int | None = typer.Argument(None, help="Job id (default: all jobs)."),
               state_dir: Path | None = state_dir_option(), addr: str | None = _addr_option(),
               token_file: Path | None = _token_option(), tls_ca: Path | None = _ca_option(),
               user_token_file: Path | None = _user_token_option(), as_json: bool = json_option()) -> None:
        """Jobs: state, GPUs, run time, limit, and where they run or why they wait (one line each)."""
        jobs = _client(state_dir, addr, token_file, tls_ca, user_token_file).call("status", {"job": job}, RETRY_FOR_S)["jobs"]
        _emit_json(jobs) if as_json else tables.write(tables.jobs_table(jobs))

    @app.command()
    def queue(state_dir: Path | None = state_dir_option(), addr: str | None = _addr_option(),
              token_file: Path | None = _token_option(), tls_ca: Path | None = _ca_option(),
              user_token_file: Path | None = _user_token_option(), as_json: bool = json_option()) -> None:
        """Jobs waiting (with their pending reason) or holding GPUs."""
        jobs = _client(state_dir, addr, token_file, tls_ca, user_token_file).call("queue", None, RETRY_FOR_S)["jobs"]
        _emit_json(jobs) if as_json else tables.write(tables.jobs_table(jobs))

    @app.command()
    def history(user: str | None = typer.Option(None, "--user", "-u", help="Only this user's jobs."),
                every: bool = typer.Option(False, "--all", help="Also jobs that have not ended."),
                limit: int = typer.Option(1000, "--limit", min=1, max=10_000, help="At most this many (the newest)."),
                state_dir: Path | None = state_dir_option(), addr: str | None = _addr_option(),
                token_file: Path | None = _token_option(), tls_ca: Path | None = _ca_option(),
                user_token_file: Path | None = _user_token_option(), as_json: bool = json_option()) -> None:
        """Ended jobs, as sacct shows them: submit, start, end, wait, run, state, exit code."""
        payload = {"user": user, "all": every, "limit": limit}
        jobs = [tables.history_row(j) for j in
                _client(state_dir, addr, token_file, tls_ca, user_token_file).call("history", payload, RETRY_FOR_S)["jobs"]]
        _emit_json(jobs) if as_json else tables.write(tables.history_table(jobs))

    @app.command()
    def cancel(jobs: list[int] | None = typer.Argument(None, help="Job ids."),
               name: str | None = typer.Option(None, "--name", "-n", help="Cancel the queued or running jobs of this name."),
               user: str | None = typer.Option(None, "--user", "-u", help="Cancel this user's queued or running jobs."),
               state_dir: Path | None = state_dir_option(), addr: str | None = _addr_option(),
               token_file: Path | None = _token_option(), tls_ca: Path | None = _ca_option(),
               user_token_file: Path | None = _user_token_option(), as_json: bool = json_option()) -> None:
        """Cancel jobs: queued ones at once, running ones by stopping their processes."""
        if not jobs and name is None and user is None:
            raise UsageError("cancel: give job ids, --name or --user")
        payload = {"jobs": list(jobs or []), "name": name, "user": user}
        results = _client(state_dir, addr, token_file, tls_ca, user_token_file).call("cancel", payload)["results"]
        if as_json:
            _emit_json(results)
        else:
            for r in results:
                _note(f"job {r['id']}: {r['state']}" if r["error"] is None else f"job {r['id']}: {r['error']}")
            if not results:
                _note("no queued or running job matched")
        failed = [r["error"] for r in results if r["error"]]
        if failed:
            raise UsageError("; ".join(failed))

    @app.command()
    def logs(job: int = typer.Argument(..., help="Job id."),
             follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing until the job ends."),
             state_dir: Path | None = state_dir_option(), addr: str | None = _addr_option(),
             token_file: Path | None = _token_option(), tls_ca: Path | None = _ca_option(),
             user_token_file: Path | None = _user_token_option()) -> None:
        """A job's output (stdout and stderr together)."""
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

    @app.command()
    def nodes(state_dir: Path | None = state_dir_option(), addr: str | None = _addr_option(),
              token_file: Path | None = _token_option(), tls_ca: Path | None = _ca_option(),
              user_token_file: Path | None = _user_token_option(), as_json: bool = json_option()) -> None:
        """Nodes, their GPUs and which job holds each."""
        rows = _client(state_dir, addr, token_file, tls_ca, user_token_file).call("nodes", None, RETRY_FOR_S)["nodes"]
        if as_json:
            _emit_json(rows)
            return
        tables.write(tables.render([("NODE", 4), ("HOST", 4), ("GPUS", 0), ("USED", 0), ("FREE", 0), ("DEVICE:JOB", 10)],
                                   [[r["node"], r["host"], str(r["gpus"]), str(r["used"]), str(r["free"]),
                                     " ".join(f"{d}:{j if j is not None else '-'}" for d, j in r["devices"].items())]
                                    for r in rows]))

    @app.command()
    def adduser(name: str = typer.Argument(..., help="User name (letters, digits, _ . -)."),
                users: Path = typer.Option(..., "--users", help="The daemon's users file (serve --users FILE)."),
                token_out: Path = typer.Option(..., "--token-out", help="Where to write the new user's token (0600); "
                                                                         "hand it to them as ~/.config/marble/token."),
                admin: bool = typer.Option(False, "--admin", help="May cancel anyone's jobs.")) -> None:
        """Add a user to a daemon's users file with a new token (the daemon picks it up on its next call)."""
        from mlsyskit.tools.sched.daemon.users import add_user

        add_user(users, name, token_out, admin)
        _note(f"user {name} added to {users}; token in {token_out}")

    register_serve(app)
    register_profile(app)
    del submit, status, queue, history, cancel, logs, nodes, adduser


__all__ = ["register"]
