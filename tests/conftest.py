"""Shared fixtures: free loopback ports and subprocesses that are always stopped."""
from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent


def port_window() -> tuple[int, int]:
    """Ports no outgoing connection is given as its source port. A port the OS picked (bind 0) is
    in the ephemeral range, and between the pick and the test's bind any connect() may take it:
    CI runs lost ports so ('address already in use'), a node's links connecting while the next
    node of the same cluster was still to bind. Above Ray's worker ports (10002-19999)."""
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        low, high = 32_768, 60_999  # Linux's default
    return (20_000, low) if low - 20_000 >= 5_000 else (high + 1, 65_000)


_ports_given: set[int] = set()  # never the same port twice in one run, bound yet or not
_port_rng = random.Random(20_261_201)


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def claim_ports(base: int, width: int) -> bool:
    """Claim base..base+width-1 for this run if none was handed out before and all are free now."""
    ports = range(base, base + width)
    if any(p in _ports_given for p in ports) or not all(port_is_free(p) for p in ports):
        return False
    _ports_given.update(ports)
    return True


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago, outside the ephemeral range."""
    start, stop = port_window()
    for _ in range(2000):
        port = _port_rng.randrange(start, stop)
        if claim_ports(port, 1):
            return port
    raise RuntimeError("no free port")


def wait_for_port(port: int, host: str = "127.0.0.1", timeout: float = 20.0,
                  proc: subprocess.Popen | None = None) -> None:
    """Poll until something accepts connections on host:port (a readiness check, not a sleep)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before listening on {port}")
        try:
            with socket.create_connection((host, port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.02)
    raise TimeoutError(f"nothing listened on {host}:{port} within {timeout}s")


class ProcManager:
    """Starts subprocesses in their own process group and stops all of them at teardown."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []

    def start(self, args: Sequence[str], *, env: dict[str, str] | None = None, cwd: str | Path | None = None,
              stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kwargs) -> subprocess.Popen:
        full_env = {**os.environ, **(env or {})}
        full_env["PATH"] = f"{VENV_BIN}{os.pathsep}{full_env.get('PATH', '')}"
        proc = subprocess.Popen(list(args), env=full_env, cwd=cwd, stdout=stdout, stderr=stderr,
                                start_new_session=True, **kwargs)
        self.procs.append(proc)
        return proc

    def stop(self, proc: subprocess.Popen, timeout: float = 5.0) -> int:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()
        for stream in (proc.stdout, proc.stderr, proc.stdin):
            if stream:
                stream.close()
        return proc.returncode

    def kill(self, proc: subprocess.Popen) -> None:
        """SIGKILL the process group at once (a crash, for fault tests)."""
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()

    def stop_all(self) -> None:
        for proc in reversed(self.procs):
            self.stop(proc)


@pytest.fixture
def proc_manager() -> Iterator[ProcManager]:
    manager = ProcManager()
    try:
        yield manager
    finally:
        manager.stop_all()


@pytest.fixture
def port_factory() -> Callable[[], int]:
    return free_port


def pytest_collection_modifyitems(config, items):
    import importlib.util

    has_cuda = False
    if importlib.util.find_spec("torch") is not None:
        import torch

        has_cuda = torch.cuda.is_available()
    if not has_cuda:
        skip = pytest.mark.skip(reason="needs a CUDA GPU (run on a GPU machine: scripts/gpu_check)")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


@dataclass
class CliResult:
    exit_code: int
    output: str
    stdout: str


def invoke_cli(app: Any, args: Sequence[str]) -> CliResult:
    """Run a typer app in-process as its console script does (core.cli.run_app): a UserError becomes one
    `error: <message>` line and its exit code; any other exception fails the calling test."""
    from typer.testing import CliRunner

    from mlsyskit.core.errors import UserError

    res = CliRunner().invoke(app, list(args))
    if isinstance(res.exception, UserError):
        return CliResult(res.exception.exit_code, f"{res.output}error: {res.exception}", res.stdout)
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    return CliResult(res.exit_code, res.output, res.stdout)
