"""The daemon's client commands on the `marble` app: submit, status, queue, cancel, history, logs,
nodes, adduser (and serve and profile from their own modules).

Clients find the daemon through its state directory (daemon.json + token, written by `serve`),
or --addr/--token-file/--tls-ca; MLSYSKIT_MARBLE_STATE_DIR and MLSYSKIT_MARBLE_ADDR set them for
every command. A daemon with users (serve --users) wants each caller's own token instead
(--user-token-file, default ~/.config/marble/token).

The commands' work is in client_commands.py (each function below hands it its options, `**locals()`);
client_cli.py runs the same functions straight from the command line without building this app.
Client commands import only the RPC client and plain-text tables (tables.py): no policy, model,
simulator or rich, so each answers in a fraction of a second.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from mlsyskit.core.cli import json_option
from mlsyskit.tools.sched.daemon import client_commands as run
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


def register(app: typer.Typer) -> None:
    @app.command()
    def submit(
        job_file: Path | None = typer.Argument(None, help="job.toml (cmd, app, gpus, min_gpus, max_gpus, name, time, "
                                                          "dependency, nodes, array, ...)."),
        cmd: str | None = typer.Option(None, "--cmd", help="Shell command to run."),
        app_name: str | None = typer.Option(None, "--app", help="Application the throughput model knows (marble model; optional: without it the job runs on exactly --gpus, and --min-gpus needs it)."),
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
        run.submit(**locals())

    @app.command()
    def status(job: int | None = typer.Argument(None, help="Job id (default: all jobs)."),
               state_dir: Path | None = state_dir_option(), addr: str | None = _addr_option(),
               token_file: Path | None = _token_option(), tls_ca: Path | None = _ca_option(),
               user_token_file: Path | None = _user_token_option(), as_json: bool = json_option()) -> None:
        """Jobs: state, GPUs, run time, limit, and where they run or why they wait (one line each)."""
        run.status(**locals())

    @app.command()
    def queue(state_dir: Path | None = state_dir_option(), addr: str | None = _addr_option(),
              token_file: Path | None = _token_option(), tls_ca: Path | None = _ca_option(),
              user_token_file: Path | None = _user_token_option(), as_json: bool = json_option()) -> None:
        """Jobs waiting (with their pending reason) or holding GPUs."""
        run.queue(**locals())

    @app.command()
    def history(user: str | None = typer.Option(None, "--user", "-u", help="Only this user's jobs."),
                every: bool = typer.Option(False, "--all", help="Also jobs that have not ended."),
                limit: int = typer.Option(1000, "--limit", min=1, max=10_000, help="At most this many (the newest)."),
                state_dir: Path | None = state_dir_option(), addr: str | None = _addr_option(),
                token_file: Path | None = _token_option(), tls_ca: Path | None = _ca_option(),
                user_token_file: Path | None = _user_token_option(), as_json: bool = json_option()) -> None:
        """Ended jobs, as sacct shows them: submit, start, end, wait, run, state, exit code."""
        run.history(**locals())

    @app.command()
    def cancel(jobs: list[int] | None = typer.Argument(None, help="Job ids."),
               name: str | None = typer.Option(None, "--name", "-n", help="Cancel the queued or running jobs of this name."),
               user: str | None = typer.Option(None, "--user", "-u", help="Cancel this user's queued or running jobs."),
               state_dir: Path | None = state_dir_option(), addr: str | None = _addr_option(),
               token_file: Path | None = _token_option(), tls_ca: Path | None = _ca_option(),
               user_token_file: Path | None = _user_token_option(), as_json: bool = json_option()) -> None:
        """Cancel jobs: queued ones at once, running ones by stopping their processes."""
        run.cancel(**locals())

    @app.command()
    def logs(job: int = typer.Argument(..., help="Job id."),
             follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing until the job ends."),
             state_dir: Path | None = state_dir_option(), addr: str | None = _addr_option(),
             token_file: Path | None = _token_option(), tls_ca: Path | None = _ca_option(),
             user_token_file: Path | None = _user_token_option()) -> None:
        """A job's output (stdout and stderr together)."""
        run.logs(**locals())

    @app.command()
    def nodes(state_dir: Path | None = state_dir_option(), addr: str | None = _addr_option(),
              token_file: Path | None = _token_option(), tls_ca: Path | None = _ca_option(),
              user_token_file: Path | None = _user_token_option(), as_json: bool = json_option()) -> None:
        """Nodes, their GPUs and which job holds each."""
        run.nodes(**locals())

    @app.command()
    def adduser(name: str = typer.Argument(..., help="User name (letters, digits, _ . -)."),
                users: Path = typer.Option(..., "--users", help="The daemon's users file (serve --users FILE)."),
                token_out: Path = typer.Option(..., "--token-out", help="Where to write the new user's token (0600); "
                                                                         "hand it to them as ~/.config/marble/token."),
                admin: bool = typer.Option(False, "--admin", help="May cancel anyone's jobs.")) -> None:
        """Add a user to a daemon's users file with a new token (the daemon picks it up on its next call)."""
        from mlsyskit.tools.sched.daemon.users import add_user

        add_user(users, name, token_out, admin)
        run.note(f"user {name} added to {users}; token in {token_out}")

    register_serve(app)
    register_profile(app)
    del submit, status, queue, history, cancel, logs, nodes, adduser


__all__ = ["register"]
