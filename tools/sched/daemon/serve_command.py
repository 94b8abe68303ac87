"""`marble serve`: settings (flags over --config FILE.toml over defaults). The daemon itself
(runner.py: state dir, TLS, model, policy, executor) is imported when the command runs, so the
client commands on the same app never load it."""
from __future__ import annotations

from pathlib import Path

import typer

from mlsyskit.core.cli import config_option, load_command_config, quiet_option, verbose_option


def register_serve(app: typer.Typer) -> None:
    @app.command()
    def serve(
        cluster: Path | None = typer.Option(None, "--cluster", help="cluster.toml: [[nodes]] with name, gpus, host, devices, logical."),
        executor: str | None = typer.Option(None, "--executor", help="How jobs run: local (process groups on this "
                                            "machine) or slurm (sbatch on a Slurm cluster); default local."),
        policy: str | None = typer.Option(None, "--policy", help="Scheduling policy (the simulator's; `marble policies` "
                                          "lists them; default: the suite's default policy). Its preemptions and "
                                          "resizes are carried out where the executor can restart jobs (local: the "
                                          "job's processes are stopped and it is queued again); on slurm they are "
                                          "not."),
        efficiency_threshold: float | None = typer.Option(None, "--efficiency-threshold", help="marble-fifo and marble-las: least gain per added GPU (default 0.5; the default policy reads neither threshold)."),
        pressure_threshold: float | None = typer.Option(None, "--pressure-threshold", help="marble-fifo: the same under queue pressure (default 0.8)."),
        state_dir: Path | None = typer.Option(None, "--state-dir", envvar="MLSYSKIT_MARBLE_STATE_DIR",
                                              help="Job table, logs, token, daemon.json (default ~/.local/state/marble)."),
        listen: str | None = typer.Option(None, "--listen", help="Address to serve on (default 127.0.0.1:0, any free port)."),
        token_file: Path | None = typer.Option(None, "--token-file", help="Shared secret (default: made in the state dir)."),
        tls: bool | None = typer.Option(None, "--tls/--no-tls", help="Serve TLS with a CA made in the state dir."),
        tls_cert: Path | None = typer.Option(None, "--tls-cert", help="Server certificate (PEM); with --tls-key."),
        tls_key: Path | None = typer.Option(None, "--tls-key", help="Server key (PEM)."),
        profiles: Path | None = typer.Option(None, "--profiles", help="Folder of measured applications "
                                             "(APP/placements.csv, as marble profile --out writes) to add to the model."),
        poll_interval: float | None = typer.Option(None, "--poll-interval", help="Seconds between job checks (default 0.5)."),
        max_time: str | None = typer.Option(None, "--max-time", help="Longest wall time a job may ask for (QOS "
                                            "MaxWall; longer ones wait with reason QOSMaxWall), and the limit of jobs "
                                            "that give none. Default: none."),
        users: Path | None = typer.Option(None, "--users", help="users.toml with per-user tokens (marble adduser): "
                                          "every call must then prove its user; fair share is per user."),
        config: Path | None = config_option(), verbose: bool = verbose_option(), quiet: bool = quiet_option(),
    ) -> None:
        """Run the scheduler daemon: a job table that survives restarts, the policy, an executor."""
        from mlsyskit.core.config import load_toml
        from mlsyskit.core.console import set_verbosity
        from mlsyskit.tools.sched.daemon.runner import serve_with
        from mlsyskit.tools.sched.daemon.settings import ServeSettings

        set_verbosity(verbose, quiet)
        flags = {"cluster": cluster, "executor": executor, "policy": policy, "efficiency_threshold": efficiency_threshold,
                 "pressure_threshold": pressure_threshold, "state_dir": state_dir, "listen": listen,
                 "token_file": token_file, "tls": tls, "tls_cert": tls_cert, "tls_key": tls_key, "profiles": profiles,
                 "poll_interval": poll_interval, "max_time": max_time, "users": users}
        section = "serve" if config is not None and "serve" in load_toml(config) else None
        cfg = load_command_config(ServeSettings, config, {k: str(v) if isinstance(v, Path) else v
                                                          for k, v in flags.items()}, section=section)
        serve_with(cfg)

    del serve


