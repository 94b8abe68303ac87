"""`marble serve`: settings (flags over --config FILE.toml over defaults), state dir, TLS, the model."""
from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from pathlib import Path

import typer

from mlsyskit.core.cli import config_option, load_command_config, quiet_option, verbose_option
from mlsyskit.core.clock import RealClock
from mlsyskit.core.config import load_toml, require
from mlsyskit.core.console import log, set_verbosity
from mlsyskit.core.errors import UsageError
from mlsyskit.core.rpc import RpcError, ServerTls
from mlsyskit.tools.sched.daemon.client import default_state_dir
from mlsyskit.tools.sched.daemon.jobstore import JobStore
from mlsyskit.tools.sched.daemon.scheduler import Scheduler
from mlsyskit.tools.sched.daemon.service import DaemonFiles, ensure_token, lock_state_dir, run_daemon
from mlsyskit.tools.sched.daemon.specs import load_cluster
from mlsyskit.tools.sched.executors import EXECUTORS
from mlsyskit.tools.sched.policies import POLICIES, PolicyOptions, create_policy
from mlsyskit.tools.sched.throughput import ThroughputModel


class WallClock(RealClock):
    """Seconds since the epoch: job times in the store must mean the same after a restart."""

    def now(self) -> float:
        return time.time()


@dataclass(frozen=True)
class ServeSettings:
    cluster: str = ""
    executor: str = "local"
    policy: str = "marble"
    efficiency_threshold: float = 0.5
    pressure_threshold: float = 0.8
    state_dir: str = ""
    listen: str = "127.0.0.1:0"
    token_file: str = ""
    tls: bool = False
    tls_cert: str = ""
    tls_key: str = ""
    profiles: str = ""
    poll_interval: float = 0.5

    def __post_init__(self) -> None:
        require(bool(self.cluster), "cluster: required (--cluster or cluster = ... in --config)")
        require(self.executor in EXECUTORS, f"executor: unknown {self.executor!r}; choose from {', '.join(EXECUTORS)}")
        require(self.policy in POLICIES, f"policy: unknown {self.policy!r}; choose from {', '.join(POLICIES)}")
        require(0.05 <= self.poll_interval <= 60, f"poll_interval: must be in [0.05, 60] s, got {self.poll_interval}")
        require(bool(self.tls_cert) == bool(self.tls_key), "tls_cert and tls_key go together")


def register_serve(app: typer.Typer) -> None:
    @app.command()
    def serve(
        cluster: Path | None = typer.Option(None, "--cluster", help="cluster.toml: [[nodes]] with name, gpus, host, devices, logical."),
        executor: str | None = typer.Option(None, "--executor", help=f"How jobs run: {', '.join(EXECUTORS.names())} (default local)."),
        policy: str | None = typer.Option(None, "--policy", help=f"Scheduling policy (the simulator's): "
                                          f"{', '.join(POLICIES.names())} (default marble). Preemption and resizing "
                                          "are not carried out on real jobs."),
        efficiency_threshold: float | None = typer.Option(None, "--efficiency-threshold", help="marble: least gain per added GPU (default 0.5)."),
        pressure_threshold: float | None = typer.Option(None, "--pressure-threshold", help="marble: the same under queue pressure (default 0.8)."),
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
        config: Path | None = config_option(), verbose: bool = verbose_option(), quiet: bool = quiet_option(),
    ) -> None:
        """Run the scheduler daemon: a job table that survives restarts, the policy, an executor."""
        set_verbosity(verbose, quiet)
        flags = {"cluster": cluster, "executor": executor, "policy": policy, "efficiency_threshold": efficiency_threshold,
                 "pressure_threshold": pressure_threshold, "state_dir": state_dir, "listen": listen,
                 "token_file": token_file, "tls": tls, "tls_cert": tls_cert, "tls_key": tls_key, "profiles": profiles,
                 "poll_interval": poll_interval}
        section = "serve" if config is not None and "serve" in load_toml(config) else None
        cfg = load_command_config(ServeSettings, config, {k: str(v) if isinstance(v, Path) else v
                                                          for k, v in flags.items()}, section=section)
        serve_with(cfg)

    del serve


def serve_with(cfg: ServeSettings) -> None:
    spec = load_cluster(cfg.cluster)
    options = PolicyOptions(efficiency_threshold=cfg.efficiency_threshold, pressure_threshold=cfg.pressure_threshold)
    files = DaemonFiles(Path(cfg.state_dir or default_state_dir()).absolute())
    try:
        files.state_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"cannot create --state-dir {files.state_dir}: {e.strerror}") from None
    server_tls, ca = _server_tls(files, cfg)
    if server_tls is None and not cfg.listen.startswith(("127.", "localhost", "[::1]")):
        raise UsageError(f"--listen {cfg.listen} is not loopback: serve it with --tls or --tls-cert/--tls-key")
    model = _model(Path(cfg.profiles) if cfg.profiles else None)
    executor = EXECUTORS.get(cfg.executor)()
    lock_fd = lock_state_dir(files)
    try:
        token = ensure_token(files, Path(cfg.token_file) if cfg.token_file else None)
        scheduler = Scheduler(spec, JobStore(files.db), executor, create_policy(cfg.policy, model, options), model,
                              WallClock(), files.state_dir, log=log)
        info = {"policy": cfg.policy, "executor": cfg.executor, "nodes": len(spec.nodes),
                "gpus_per_node": spec.gpus_per_node, "pid": os.getpid()}
        try:
            asyncio.run(run_daemon(scheduler, files, cfg.listen, token, server_tls, ca, cfg.poll_interval, info, log))
        finally:
            scheduler.store.close()
    finally:
        os.close(lock_fd)


def _model(extra: Path | None) -> ThroughputModel:
    """The shipped Pollux measurements plus the user's own (`marble profile --out`), same names refused."""
    if extra is None:
        return ThroughputModel()
    from mlsyskit.tools.sched.profiles import load_profiles

    shipped = load_profiles()
    try:
        own = load_profiles(extra)
    except (FileNotFoundError, KeyError, ValueError) as e:
        raise UsageError(f"--profiles {extra}: {e}") from None
    clash = sorted(set(own) & set(shipped))
    if clash:
        raise UsageError(f"--profiles {extra}: {', '.join(clash)} would replace a shipped application")
    return ThroughputModel({**shipped, **own})


def _server_tls(files: DaemonFiles, cfg: ServeSettings) -> tuple[ServerTls | None, Path | None]:
    if cfg.tls_cert:
        try:
            return ServerTls.from_files(cfg.tls_cert, cfg.tls_key), None
        except RpcError as e:
            raise UsageError(e.message) from None
    if not cfg.tls:
        return None, None
    from mlsyskit.core.rpc_tls import issue_certs

    made = issue_certs(files.tls_dir)  # kept across restarts: clients keep trusting the same CA
    return ServerTls.from_files(made.server_cert, made.server_key), made.ca
