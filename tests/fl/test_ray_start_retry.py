"""A local Ray start that misses Ray's fixed 30 s node-registration wait (a busy host) is tried again;
any other failure, or a second miss past the deadline, is one RuntimeFailure line. Ray is faked: the
point is the backend's decision, not Ray (tests/fl/test_ray_local.py starts a real one)."""
from __future__ import annotations

import sys
import types

import pytest

from mlsyskit.core.clock import VirtualClock
from mlsyskit.core.errors import RuntimeFailure
from mlsyskit.tools.fl.ray_backend import RayBackend

TIMED_OUT = "The current node timed out during startup. This could happen because some of the raylet failed"


class FakeRay(types.ModuleType):
    """Ray's module surface the backend touches; local starts fail with the given errors, then work."""

    def __init__(self, clock: VirtualClock, local_failures: list[Exception]) -> None:
        super().__init__("ray")
        self.clock, self.local_failures = clock, list(local_failures)
        self.local_tries = self.shutdowns = 0
        self.initialized = False

    def is_initialized(self) -> bool:
        return self.initialized

    def init(self, address: str, **_: object) -> None:
        if address == "auto":
            raise ConnectionError("Could not find any running Ray instance")
        self.local_tries += 1
        self.clock.advance(31.0)  # Ray's own wait before it gives up on the node
        if self.local_failures:
            raise self.local_failures.pop(0)
        self.initialized = True

    def shutdown(self) -> None:
        self.shutdowns += 1
        self.initialized = False

    def remote(self, fn):
        return types.SimpleNamespace(options=lambda **_: fn)


def backend_with(monkeypatch, failures: list[Exception]) -> tuple[FakeRay, VirtualClock]:
    clock = VirtualClock()
    fake = FakeRay(clock, failures)
    monkeypatch.setitem(sys.modules, "ray", fake)
    return fake, clock


def test_a_start_that_timed_out_is_tried_again_and_the_half_started_one_shut_down(monkeypatch):
    fake, clock = backend_with(monkeypatch, [Exception(TIMED_OUT)])
    backend = RayBackend(clock=clock)
    assert backend.started_local and fake.local_tries == 2 and fake.shutdowns == 1


def test_another_start_failure_is_not_retried(monkeypatch):
    fake, clock = backend_with(monkeypatch, [Exception("object store memory is too small")])
    with pytest.raises(RuntimeFailure, match=r"cannot start a local Ray \(object store memory is too small\)"):
        RayBackend(clock=clock)
    assert fake.local_tries == 1


def test_a_start_that_keeps_timing_out_gives_up_with_rays_error(monkeypatch):
    fake, clock = backend_with(monkeypatch, [Exception(TIMED_OUT)] * 5)
    with pytest.raises(RuntimeFailure, match="cannot start a local Ray .*timed out during startup"):
        RayBackend(clock=clock)
    assert fake.local_tries == 3  # 3 x 31 s passes the 75 s deadline: no fourth try
