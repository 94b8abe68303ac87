"""The one launcher of bespokv's processes: `bespokv up` (processes.py), the checker's process
cluster (check/procs.py), the supervisor (supervisor.py) and the in-process cluster (cluster.py).

- spawn: a process in its own session (so its whole group can be signalled), its output appended
  to its log, stdin closed.
- ready / wait_ready: the one readiness wait. A node is ready when it answers PING and has caught
  up (INFO catching_up:0); a proxy or a redis-server when it answers PING. The wait polls every
  endpoint in turn until all are ready, failing at once if a watched process exited meanwhile.
- stop: the one stop sequence. SIGTERM to every process group, then each is given until the
  common deadline, then SIGKILL; our own children are reaped (through their Popen when we hold
  one: a bare waitpid would steal the exit status its owner reads).
- kill: SIGKILL at once (a stopped process cannot handle SIGTERM) and wait until it is gone.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from mlsyskit.core.clock import Clock, RealClock
from mlsyskit.tools.kv.client.call import call, parse_info

# The command line of a node, proxy or supervisor process, before its arguments (`node ID --data-dir D`, ...):
# the same commands as `bespokv node|proxy|supervise --foreground`, started without the CLI's imports (entry.py).
ENTRY = [sys.executable, "-m", "mlsyskit.tools.kv.ops.entry"]
Endpoint = tuple[str, str, int]  # (name, host, port): "proxy", "redis:...", else a node
Proc = int | subprocess.Popen  # a pid, or a child we hold


def spawn(argv: Sequence[str], log_path: Path) -> subprocess.Popen:
    """Start argv detached in its own session, stdout and stderr appended to log_path."""
    with open(log_path, "ab") as log:
        return subprocess.Popen(list(argv), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)


def ready(name: str, host: str, port: int, password: bytes | None = None) -> bool:
    """Whether the endpoint answers PING and, for a node, has caught up (INFO catching_up:0)."""
    try:
        if call(host, port, "PING", timeout=0.5, password=password) != b"PONG":
            return False
        if name == "proxy" or name.startswith("redis"):
            return True
        info = parse_info(call(host, port, "INFO", timeout=0.5, password=password))
        return info.get("catching_up", "0") == "0"
    except OSError:  # not listening yet, or refused (e.g. -LOADING): not ready
        return False


def wait_ready(endpoints: Sequence[Endpoint], *, exited: Callable[[], list[str]] = list,
               clock: Clock | None = None, timeout: float = 30.0, password: bytes | None = None,
               logs: str = "", error: type[Exception] = RuntimeError) -> None:
    """Poll until every endpoint is ready. Raises `error` naming what `exited()` reports as gone, or
    the first endpoint not ready by the deadline."""
    clock = clock or RealClock()
    deadline = clock.now() + timeout
    for name, host, port in endpoints:
        while not ready(name, host, port, password):
            dead = exited()
            if dead:
                raise error(f"{', '.join(dead)} exited during start-up; see {logs}")
            if clock.now() > deadline:
                raise error(f"{name} at {host}:{port} was not up and caught up within {timeout:.0f}s; see {logs}")
            clock.sleep(0.05)


def alive(pid: int) -> bool:
    """Running (a zombie waiting for a parent that does not reap, e.g. a bare container init, is not)."""
    import psutil  # here, not at import: a node process imports this module but never calls it (~0.03 s)

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def running(proc: Proc) -> bool:
    """Whether it still runs; reaps it if it is our child and has exited."""
    if isinstance(proc, subprocess.Popen):
        return proc.poll() is None
    try:
        os.waitpid(proc, os.WNOHANG)
    except ChildProcessError:
        pass
    return alive(proc)


def _pid(proc: Proc) -> int:
    return proc.pid if isinstance(proc, subprocess.Popen) else proc


def signal_group(proc: Proc, sig: int) -> None:
    """Send sig to the process's group (each process starts its own session), else to it alone."""
    for send in (os.killpg, os.kill):
        try:
            send(_pid(proc), sig)
            return
        except (ProcessLookupError, PermissionError):
            continue


def stop(procs: Sequence[Proc], clock: Clock | None = None, grace: float = 5.0) -> None:
    """SIGTERM every group, wait up to `grace` for them all, SIGKILL the ones left."""
    clock = clock or RealClock()
    for proc in procs:
        if running(proc):
            signal_group(proc, signal.SIGTERM)
    deadline = clock.now() + grace
    for proc in procs:
        while running(proc) and clock.now() < deadline:
            clock.sleep(0.02)
        if running(proc):
            kill(proc)


def kill(proc: Proc, gone: Callable[[], bool] | None = None, timeout: float = 5.0) -> None:
    """SIGKILL the group and wait (real time, the kernel's) until it is gone (`gone`, else not running)."""
    signal_group(proc, signal.SIGKILL)
    gone = gone or (lambda: not running(proc))
    deadline = time.monotonic() + timeout
    while not gone() and time.monotonic() < deadline:
        time.sleep(0.01)
    if isinstance(proc, subprocess.Popen):
        proc.poll()  # gone is a zombie until reaped
