"""One retry for the suite: capped exponential backoff with full jitter, and loops built on it.

`Backoff` is a pure policy (the caller sleeps). Attempt n waits a uniform random time in
[0, min(cap, initial * 2**n)] ("full jitter", AWS Architecture Blog 2015): after a server restart
many clients reconnect spread out instead of in lock-step waves. The RNG is injected, so a seeded
client retries on a reproducible schedule.

`retry_call` / `retry_async` run a call until it succeeds, raises something not retriable, or the
deadline passes (then the last error is raised). Time comes from an injected `Clock`, so tests
run the loop on a virtual clock.
"""
from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

from mlsyskit.core.clock import Clock, RealClock

T = TypeVar("T")


class Backoff:
    def __init__(self, initial_s: float = 0.1, cap_s: float = 5.0, rng: random.Random | None = None) -> None:
        if not 0 < initial_s <= cap_s:
            raise ValueError(f"need 0 < initial ({initial_s}) <= cap ({cap_s})")
        self.initial_s, self.cap_s = initial_s, cap_s
        self.rng = rng or random.Random(0)
        self.attempt = 0

    def ceiling(self) -> float:
        """The longest the next wait can be."""
        return min(self.cap_s, self.initial_s * 2.0 ** min(self.attempt, 60))

    def next_delay(self) -> float:
        delay = self.rng.uniform(0.0, self.ceiling())
        self.attempt += 1
        return delay

    def reset(self) -> None:
        """Contact was made: the next failure starts from the shortest wait again."""
        self.attempt = 0


def _wait_before_next(error: BaseException, retriable: Callable[[BaseException], bool], deadline: float,
                      backoff: Backoff, clock: Clock) -> float:
    """The wait before the next try, or re-raise `error` when it is final or time is up."""
    if not retriable(error):
        raise error
    remaining = deadline - clock.now()
    if remaining <= 0:
        raise error
    return min(backoff.next_delay(), remaining)


def retry_call(fn: Callable[[], T], *, retriable: Callable[[BaseException], bool], deadline_s: float,
               backoff: Backoff | None = None, clock: Clock | None = None) -> T:
    """fn() until it returns; retriable errors are retried until deadline_s has passed (0: one try)."""
    clock = clock or RealClock()
    backoff = backoff or Backoff()
    deadline = clock.now() + deadline_s
    while True:
        try:
            return fn()
        except Exception as error:  # noqa: BLE001 - the predicate decides; others re-raise
            clock.sleep(_wait_before_next(error, retriable, deadline, backoff, clock))


async def retry_async(fn: Callable[[], Awaitable[T]], *, retriable: Callable[[BaseException], bool],
                      deadline_s: float, backoff: Backoff | None = None, clock: Clock | None = None) -> T:
    """The async form of retry_call: awaits fn() and sleeps with clock.asleep."""
    clock = clock or RealClock()
    backoff = backoff or Backoff()
    deadline = clock.now() + deadline_s
    while True:
        try:
            return await fn()
        except Exception as error:  # noqa: BLE001 - the predicate decides; others re-raise
            await clock.asleep(_wait_before_next(error, retriable, deadline, backoff, clock))
