"""Clocks: one protocol, a real implementation and a virtual one for simulation and tests.

Policies, servers and protocols take a Clock instead of calling time.time()/time.sleep(),
so the same code runs on wall time in production and on virtual time in the simulators.
"""
from __future__ import annotations

import asyncio
import time
from typing import Protocol, runtime_checkable


@runtime_checkable
class Clock(Protocol):
    def now(self) -> float:
        """Seconds since an arbitrary epoch (monotonic)."""

    def sleep(self, seconds: float) -> None:
        """Block (real) or advance (virtual) by `seconds`."""

    async def asleep(self, seconds: float) -> None:
        """Async sleep: yields to the event loop on a real clock."""


class RealClock:
    """Monotonic wall time."""

    def now(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)

    async def asleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))


class VirtualClock:
    """Time that moves only when told to; sleeping advances it instantly."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = float(start)

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"cannot move a clock backwards by {seconds}")
        self._now += seconds

    def set(self, t: float) -> None:
        if t < self._now:
            raise ValueError(f"cannot move a clock backwards from {self._now} to {t}")
        self._now = float(t)

    def sleep(self, seconds: float) -> None:
        self.advance(max(0.0, seconds))

    async def asleep(self, seconds: float) -> None:
        self.advance(max(0.0, seconds))
