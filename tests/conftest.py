"""Shared fixtures: free loopback ports and subprocesses that are always stopped."""
from __future__ import annotations

import os
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
import xdist_plan

from mlsyskit.core import net

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent


# One port picker for product and tests (per-xdist-worker windows: see pytest_configure below).
free_port = net.free_port
port_window = net.port_window
port_is_free = net.port_is_free
claim_ports = net.claim_range


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


# ---------------------------------------------------------------- parallel workers and the fast tier

def load_script(path: Path, name: str) -> Any:
    """A script outside the package (scripts/*.py, a torchrun worker) imported as module `name`,
    registered in sys.modules so process pools can pickle its functions by name."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def pytest_configure(config) -> None:
    """Each pytest-xdist worker picks ports from its own slice of the window, and so do the
    processes it starts (they inherit MLSYSKIT_PORT_WINDOW): parallel workers never race for a port."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    if worker.startswith("gw") and count > 0:
        os.environ[net.WINDOW_ENV] = net.split_window(int(worker[2:]), count)
    _one_compute_thread()


def _one_compute_thread() -> None:
    """One torch and one BLAS thread in the test process, as FL processes run (tools/fl/threads.py): the
    tests' tensors are tiny, and with several workers on two cores multithreaded kernels spin-wait for
    each other (a tiny MLP's backward took 0.5 s at load 20; tests/fl/test_pay_verified.py fell from 60
    to 14 CPU seconds). Processes the slow tests start keep their own settings."""
    import importlib.util

    if importlib.util.find_spec("threadpoolctl") is not None:
        from threadpoolctl import threadpool_limits

        threadpool_limits(1)
    if importlib.util.find_spec("torch") is not None:
        import torch

        torch.set_num_threads(1)


def pytest_xdist_make_scheduler(config, log):
    """--dist loadfile with the costliest files first (tests/xdist_plan.py)."""
    return xdist_plan.make_scheduler(config, log)


class StartsProcessesError(RuntimeError):
    """A test outside the slow tier started a process or a server."""


def _refuse(what: str) -> Callable[..., Any]:
    def refuse(*_args: Any, **_kwargs: Any) -> Any:
        raise StartsProcessesError(
            f"this test {what}: mark it @pytest.mark.slow (./scripts/test --fast runs only tests that "
            "start no server, cluster or subprocess)")
    return refuse


@pytest.fixture(autouse=True)
def _fast_tier_guard(request, monkeypatch) -> None:
    """Tests not marked slow may not start processes or listen on sockets, so the fast tier stays
    fast and every test that does is marked (the guard runs in the full suite too)."""
    if request.node.get_closest_marker("slow") or request.node.get_closest_marker("gpu"):
        return
    monkeypatch.setattr(subprocess.Popen, "_execute_child", _refuse("starts a subprocess"))
    monkeypatch.setattr(os, "fork", _refuse("forks a process"))
    monkeypatch.setattr(socket.socket, "listen", _refuse("listens on a socket"))
    try:
        import grpc
        import grpc.aio
    except ImportError:
        return
    monkeypatch.setattr(grpc, "server", _refuse("starts a gRPC server"))
    monkeypatch.setattr(grpc.aio, "server", _refuse("starts a gRPC server"))
