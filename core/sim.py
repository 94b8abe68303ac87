"""Deterministic discrete-event loop and seeded RNG streams.

One master seed derives an independent sub-seed per named component (as TigerBeetle's
VOPR does), so adding a component never perturbs the random streams of the others.
Events at equal times run in the order they were scheduled (a sequence number breaks ties),
so a replay with the same seed is identical.
"""
from __future__ import annotations

import hashlib
import heapq
import itertools
import random
from collections.abc import Callable
from typing import Any

import numpy as np

from mlsyskit.core.clock import VirtualClock


def sub_seed(master_seed: int, component: str) -> int:
    """A stable 63-bit seed for `component`, derived from the master seed (blake2b, not hash())."""
    digest = hashlib.blake2b(f"{master_seed}:{component}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


class Seeds:
    """Hands out per-component RNGs from one master seed."""

    def __init__(self, master_seed: int) -> None:
        self.master_seed = int(master_seed)

    def seed(self, component: str) -> int:
        return sub_seed(self.master_seed, component)

    def random(self, component: str) -> random.Random:
        return random.Random(self.seed(component))

    def numpy(self, component: str) -> np.random.Generator:
        return np.random.default_rng(self.seed(component))


class _Event:
    __slots__ = ("time", "seq", "action", "cancelled")

    def __init__(self, time: float, seq: int, action: Callable[[], Any]) -> None:
        self.time, self.seq, self.action, self.cancelled = time, seq, action, False


class EventHandle:
    """Returned by `schedule`; lets the caller cancel the event before it fires."""

    def __init__(self, event: _Event) -> None:
        self._event = event

    @property
    def time(self) -> float:
        return self._event.time

    def cancel(self) -> None:
        self._event.cancelled = True


class EventLoop:
    """A heap of timed callbacks driving a VirtualClock."""

    def __init__(self, clock: VirtualClock | None = None) -> None:
        self.clock = clock or VirtualClock()
        self._heap: list[tuple[float, int, _Event]] = []   # (time, seq): compared as tuples, in C
        self._seq = itertools.count()
        self.events_run = 0

    def now(self) -> float:
        return self.clock.now()

    def schedule(self, delay: float, action: Callable[[], Any]) -> EventHandle:
        if delay < 0:
            raise ValueError(f"cannot schedule in the past (delay={delay})")
        return self.schedule_at(self.clock.now() + delay, action)

    def schedule_at(self, when: float, action: Callable[[], Any]) -> EventHandle:
        if when < self.clock.now():
            raise ValueError(f"cannot schedule at {when}, before now={self.clock.now()}")
        event = _Event(float(when), next(self._seq), action)
        heapq.heappush(self._heap, (event.time, event.seq, event))
        return EventHandle(event)

    def pending(self) -> int:
        return sum(1 for _, _, e in self._heap if not e.cancelled)

    def peek_time(self) -> float | None:
        while self._heap and self._heap[0][2].cancelled:
            heapq.heappop(self._heap)
        return self._heap[0][0] if self._heap else None

    def step(self) -> bool:
        """Run the next event; False when none is left."""
        while self._heap:
            event = heapq.heappop(self._heap)[2]
            if event.cancelled:
                continue
            self.clock.set(event.time)
            event.action()
            self.events_run += 1
            return True
        return False

    def run(self, until: float | None = None, max_events: int | None = None) -> int:
        """Run events (up to time `until` and/or `max_events`); returns how many ran."""
        ran = 0
        while max_events is None or ran < max_events:
            t = self.peek_time()
            if t is None or (until is not None and t > until):
                break
            self.step()
            ran += 1
        if until is not None and until > self.clock.now():
            self.clock.set(until)
        return ran
