"""core.net (the one port picker) and core.retry (the one backoff and retry loop)."""
from __future__ import annotations

import ast
import asyncio
import random
from pathlib import Path

import pytest

from mlsyskit.core import net
from mlsyskit.core.clock import VirtualClock
from mlsyskit.core.retry import Backoff, retry_async, retry_call


def test_ports_come_from_the_window_and_are_never_given_twice(monkeypatch) -> None:
    monkeypatch.setenv(net.WINDOW_ENV, "41000-41100")
    seen = {net.free_port() for _ in range(20)}
    assert len(seen) == 20 and all(41_000 <= p < 41_100 for p in seen)
    base = net.free_range(5)
    assert not seen & set(range(base, base + 5))


def _binds_port_zero(tree: ast.AST) -> list[int]:
    """Lines of `sock.bind((host, 0))`: a port the kernel picks from its ephemeral range."""
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "bind"
            and node.args and isinstance(node.args[0], ast.Tuple) and len(node.args[0].elts) == 2
            and isinstance(node.args[0].elts[1], ast.Constant) and node.args[0].elts[1].value == 0]


def test_product_code_never_lets_the_kernel_pick_a_port() -> None:
    repo = Path(__file__).resolve().parents[2]
    assert _binds_port_zero(ast.parse("import socket\ns = socket.socket()\ns.bind(('127.0.0.1', 0))\n")) == [3]
    found = [f"{path.relative_to(repo)}:{line}" for top in ("core", "tools")
             for path in sorted((repo / top).rglob("*.py")) for line in _binds_port_zero(ast.parse(path.read_text()))]
    assert not found, "bind(0) takes a port from the ephemeral range (use core.net.free_port): " + ", ".join(found)


def test_worker_slices_do_not_overlap_and_stay_in_the_kernel_window() -> None:
    lo, hi = net.kernel_window()
    slices = [tuple(map(int, net.split_window(i, 4).split("-"))) for i in range(4)]
    assert slices[0][0] == lo and slices[-1][1] <= hi
    assert all(a[1] <= b[0] for a, b in zip(slices, slices[1:], strict=False))
    with pytest.raises(ValueError):
        net.split_window(4, 4)


@pytest.mark.parametrize("bad", ["abc", "5000", "30000-20000", "80-90"])
def test_a_bad_window_is_refused_naming_the_variable(monkeypatch, bad: str) -> None:
    monkeypatch.setenv(net.WINDOW_ENV, bad)
    with pytest.raises(ValueError, match=net.WINDOW_ENV):
        net.free_port()


def test_backoff_is_capped_full_jitter_and_resets() -> None:
    backoff = Backoff(0.1, 1.0, random.Random(3))
    ceilings = []
    for _ in range(6):
        ceilings.append(backoff.ceiling())
        assert 0.0 <= backoff.next_delay() <= ceilings[-1]
    assert ceilings == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    backoff.reset()
    assert backoff.ceiling() == 0.1
    with pytest.raises(ValueError):
        Backoff(2.0, 1.0)


def test_retry_call_retries_what_is_retriable_until_it_succeeds() -> None:
    clock, calls = VirtualClock(), []

    def flaky() -> str:
        calls.append(clock.now())
        if len(calls) < 4:
            raise ConnectionError("down")
        return "ok"

    assert retry_call(flaky, retriable=lambda e: isinstance(e, ConnectionError), deadline_s=10, clock=clock) == "ok"
    assert len(calls) == 4 and calls == sorted(calls)


def test_retry_call_raises_the_last_error_at_the_deadline_and_never_retries_the_rest() -> None:
    clock, calls = VirtualClock(), []

    def down() -> None:
        calls.append(clock.now())
        raise ConnectionError(f"try {len(calls)}")

    with pytest.raises(ConnectionError) as caught:
        retry_call(down, retriable=lambda e: True, deadline_s=3.0, clock=clock, backoff=Backoff(0.5, 0.5))
    assert clock.now() == pytest.approx(3.0) and str(caught.value) == f"try {len(calls)}"
    with pytest.raises(KeyError):
        retry_call(lambda: {}["x"], retriable=lambda e: isinstance(e, ConnectionError), deadline_s=5, clock=clock)
    tries = []
    with pytest.raises(ConnectionError):
        retry_call(lambda: tries.append(1) or down(), retriable=lambda e: True, deadline_s=0, clock=clock)
    assert len(tries) == 1  # deadline 0: one try


def test_retry_async_sleeps_on_the_injected_clock() -> None:
    clock, calls = VirtualClock(), []

    async def flaky() -> int:
        calls.append(1)
        if len(calls) < 3:
            raise TimeoutError
        return len(calls)

    assert asyncio.run(retry_async(flaky, retriable=lambda e: isinstance(e, TimeoutError), deadline_s=60,
                                   clock=clock)) == 3
    assert 0 < clock.now() < 60


def test_a_bound_port_is_taken_in_both_checks_and_free_again_once_closed() -> None:
    import socket

    port = net.free_port()
    holder = socket.socket()
    holder.bind(("127.0.0.1", port))
    assert not net.port_is_free(port) and not net.port_is_free(port, reuse_addr=True)
    holder.close()
    assert net.port_is_free(port) and net.port_is_free(port, reuse_addr=True)
