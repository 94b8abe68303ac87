"""Capped exponential backoff with full jitter, as a pure policy (the caller sleeps).

Attempt n waits a uniform random time in [0, min(cap, initial * 2**n)] ("full jitter", AWS
Architecture Blog 2015): after a server restart, many clients reconnect spread out instead of
in lock-step waves. The RNG is injected, so a seeded client retries on a reproducible schedule.
"""
from __future__ import annotations

import random


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
