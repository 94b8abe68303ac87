"""Running `marble serve`: the state directory, TLS, the model, the policy and the executor around
the scheduler and its RPC service."""
from __future__ import annotations

import asyncio
import os
import socket
import time
from pathlib import Path

from mlsyskit.core.clock import RealClock
from mlsyskit.core.config import ConfigError
from mlsyskit.core.console import log
from mlsyskit.core.errors import RuntimeFailure, UsageError
from mlsyskit.core.rpc import RpcError, ServerTls
from mlsyskit.tools.sched.daemon.files import DaemonFiles, default_state_dir
from mlsyskit.tools.sched.daemon.jobstore import JobStore
from mlsyskit.tools.sched.daemon.scheduler import Scheduler
from mlsyskit.tools.sched.daemon.service import ensure_token, lock_state_dir, run_daemon
from mlsyskit.tools.sched.daemon.settings import ServeSettings
from mlsyskit.tools.sched.daemon.specs import load_cluster, parse_time
from mlsyskit.tools.sched.daemon.users import Users
from mlsyskit.tools.sched.executors import EXECUTORS
from mlsyskit.tools.sched.policies import DEFAULT_POLICY, POLICIES, PolicyOptions, create_policy
from mlsyskit.tools.sched.policies.learned import LearnedModel, PriorModel
from mlsyskit.tools.sched.policies.option_readers import unread_options
from mlsyskit.tools.sched.throughput import ThroughputModel


class WallClock(RealClock):
    """Seconds since the epoch: job times in the store must mean the same after a restart."""

    def now(self) -> float:
        return time.time()


def serve_with(cfg: ServeSettings) -> None:
    policy = cfg.policy or DEFAULT_POLICY
    if cfg.executor not in EXECUTORS:
        raise ConfigError(f"executor: unknown {cfg.executor!r}; choose from {', '.join(EXECUTORS)}")
    if policy not in POLICIES:
        raise ConfigError(f"policy: unknown {policy!r}; choose from {', '.join(POLICIES)}")
    spec = load_cluster(cfg.cluster)
    users = Users(Path(cfg.users)) if cfg.users else None
    options = PolicyOptions(efficiency_threshold=cfg.efficiency_threshold, pressure_threshold=cfg.pressure_threshold)
    unread = unread_options([policy], options)
    if unread:
        raise UsageError("; ".join(unread))
    files = DaemonFiles(Path(cfg.state_dir or default_state_dir()).absolute())
    try:
        files.state_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"cannot create --state-dir {files.state_dir}: {e.strerror}") from None
    server_tls, ca = _server_tls(files, cfg)
    if server_tls is None and not cfg.listen.startswith(("127.", "localhost", "[::1]")):
        raise UsageError(f"--listen {cfg.listen} is not loopback: serve it with --tls or --tls-cert/--tls-key")
    _check_port(cfg.listen)
    model = daemon_model(Path(cfg.profiles) if cfg.profiles else None)
    executor = EXECUTORS.get(cfg.executor)()
    lock_fd = lock_state_dir(files)
    try:
        token = ensure_token(files, Path(cfg.token_file) if cfg.token_file else None)
        scheduler = Scheduler(spec, JobStore(files.db), executor, create_policy(policy, online_model(model), options), model,
                              WallClock(), files.state_dir, max_time_s=parse_time(cfg.max_time), log=log)
        info = {"policy": policy, "executor": cfg.executor, "nodes": len(spec.nodes),
                "gpus_per_node": spec.gpus_per_node, "pid": os.getpid(), "max_time_s": parse_time(cfg.max_time),
                "users": users is not None}
        try:
            asyncio.run(run_daemon(scheduler, files, cfg.listen, token, server_tls, ca, cfg.poll_interval, info, log,
                                   users))
        finally:
            scheduler.store.close()
    finally:
        os.close(lock_fd)


def _check_port(listen: str) -> None:
    """A port another listener holds is refused here, in one line (gRPC's own bind failure prints
    C-core lines first). SO_REUSEADDR as gRPC binds: a restarted daemon's old connections in
    TIME_WAIT do not count (core.net.port_is_free counts them: it picks ports for tests)."""
    host, _, port = listen.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    if not port.isdigit() or not int(port):
        return
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host if host != "localhost" else "127.0.0.1", int(port)))
            return
        except OSError:
            pass
    raise RuntimeFailure(f"cannot listen on {listen}: the address is in use (another daemon? pick another "
                             "--listen port, or 0 for any free one)")


def online_model(model: ThroughputModel) -> LearnedModel:
    """What the daemon's policy sizes jobs with: the profiles' fitted model (no added error: they
    are this cluster's own measurements) corrected online by the rates the running jobs report."""
    return LearnedModel(PriorModel.of(model, 0.0))


def daemon_model(extra: Path | None = None) -> ThroughputModel:
    """The shipped Pollux measurements, the linear application a job without `app` is sized by, and
    the user's own (`marble profile --out`); a name that would replace one of them is refused."""
    from mlsyskit.tools.sched.profiles import LINEAR_APP, linear_profile, load_profiles

    shipped = {**load_profiles(), LINEAR_APP: linear_profile()}
    if extra is None:
        return ThroughputModel(shipped)
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
