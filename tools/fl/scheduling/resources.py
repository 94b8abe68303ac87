"""Per-client resources for scheduling: compute speed, up/down bandwidth, slowdowns mid-run.

Profiles are drawn from FLASH's measured distributions (tools/fl/data/PROVENANCE.md): a phone's
CPU float AI score sets its compute rate relative to the median phone, and one of 19 measured
links gives mean and standard deviation of its up/down bandwidth (kbit/s).

Nothing is created up front: a client's profile is a pure function of (seed, client id), drawn
from its own sub-seed when asked for, so 100,000 clients cost nothing until they are touched and
the same client gets the same profile in every process. Slowdowns change a client's compute rate
from a point in (virtual) time on: explicit events (a test slows client 7 down at t=300) and/or a
seeded random process (a fraction of clients gets one slowdown episode at a random time).
"""
from __future__ import annotations

import bisect
import json
import random
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from mlsyskit.core.config import require
from mlsyskit.core.sim import sub_seed

DATA = Path(__file__).resolve().parent.parent / "data"


@lru_cache(maxsize=1)
def flash_tables() -> tuple[tuple[float, ...], tuple[dict[str, float], ...]]:
    """(sorted CPU float AI scores of the phones, the measured links) from the shipped FLASH files."""
    devices = json.loads((DATA / "flash-device-benchmarks.json").read_text())
    scores = []
    for device in devices:
        try:
            scores.append(float(device["CPU_F_AI_Score"]))
        except (KeyError, TypeError, ValueError):
            continue  # a few phones have no float score in the benchmark
    links = tuple(json.loads((DATA / "flash-speed-distribution.json").read_text()).values())
    return tuple(sorted(s for s in scores if s > 0)), links


@dataclass(frozen=True)
class Profile:
    client_id: int
    compute_rate: float  # samples per second at full speed
    down_kbps: float
    down_sigma: float
    up_kbps: float
    up_sigma: float


@dataclass(frozen=True)
class Slowdown:
    """From `start_s` on, client `client_id` computes `factor` times slower (factor 1: back to normal)."""

    client_id: int
    start_s: float
    factor: float

    def __post_init__(self) -> None:
        require(self.factor > 0, f"slowdown factor must be positive, got {self.factor}")
        require(self.start_s >= 0, "slowdown start must be >= 0")


class ResourceModel:
    """Lazy, seeded resource profiles plus slowdowns; the simulated side of `measured resources`.

    `random_slowdown_fraction` of clients (chosen per client from its sub-seed) get one episode
    starting uniformly in [0, horizon_s) with a factor uniform in `random_slowdown_range`.
    """

    def __init__(self, seed: int, *, median_rate: float = 200.0, slowdowns: list[Slowdown] | None = None,
                 random_slowdown_fraction: float = 0.0, random_slowdown_range: tuple[float, float] = (2.0, 5.0),
                 horizon_s: float = 3600.0) -> None:
        require(median_rate > 0, "median_rate must be positive")
        require(0 <= random_slowdown_fraction <= 1, "random_slowdown_fraction must be in [0, 1]")
        require(1 <= random_slowdown_range[0] <= random_slowdown_range[1], "slowdown range must be >= 1, ordered")
        self.seed = seed
        self.median_rate = median_rate
        self.random_slowdown_fraction = random_slowdown_fraction
        self.random_slowdown_range = random_slowdown_range
        self.horizon_s = horizon_s
        self._events: dict[int, list[Slowdown]] = {}
        for event in slowdowns or []:
            self.add_slowdown(event)
        scores, _ = flash_tables()
        self._median_score = scores[len(scores) // 2]

    def _rng(self, client_id: int, what: str) -> random.Random:
        return random.Random(sub_seed(self.seed, f"fl-sched/{what}/{client_id}"))

    def profile(self, client_id: int) -> Profile:
        """The client's static profile; the same for the same (seed, id), wherever it is asked."""
        scores, links = flash_tables()
        rng = self._rng(client_id, "profile")
        score = scores[rng.randrange(len(scores))]
        link = links[rng.randrange(len(links))]
        return Profile(client_id, self.median_rate * score / self._median_score, float(link["down_u"]),
                       float(link["down_sigma"]), float(link["up_u"]), float(link["up_sigma"]))

    def speed_quantile(self, client_id: int) -> float:
        """Where the client's phone ranks among FLASH's phones by compute score, in [0, 1)."""
        scores, _ = flash_tables()
        return self._rng(client_id, "profile").randrange(len(scores)) / len(scores)  # scores are sorted

    def add_slowdown(self, event: Slowdown) -> None:
        """An explicit slowdown; later events for the same client override earlier ones from their start."""
        events = self._events.setdefault(event.client_id, [])
        bisect.insort(events, event, key=lambda e: e.start_s)

    def _random_episode(self, client_id: int) -> Slowdown | None:
        if self.random_slowdown_fraction <= 0:
            return None
        rng = self._rng(client_id, "slowdown")
        if rng.random() >= self.random_slowdown_fraction:
            return None
        low, high = self.random_slowdown_range
        return Slowdown(client_id, rng.uniform(0, self.horizon_s), rng.uniform(low, high))

    def slowdown_factor(self, client_id: int, now_s: float) -> float:
        """How many times slower than its profile the client computes at time `now_s`."""
        factor = 1.0
        episode = self._random_episode(client_id)
        if episode is not None and now_s >= episode.start_s:
            factor = episode.factor
        events = self._events.get(client_id, [])
        i = bisect.bisect_right([e.start_s for e in events], now_s)
        if i:
            factor = events[i - 1].factor  # an explicit event is the latest word on this client
        return factor

    def round_cost(self, client_id: int, now_s: float, samples: int, epochs: int, model_bytes: int,
                   rng: random.Random) -> tuple[float, float]:
        """(compute seconds, communication seconds) for one round started at `now_s`.

        Bandwidth is drawn per round from the link's normal distribution, floored at 10% of its
        mean (a measured link never drops to zero for a whole round in FLASH's data).
        """
        p = self.profile(client_id)
        compute = samples * epochs / p.compute_rate * self.slowdown_factor(client_id, now_s)
        down = max(rng.gauss(p.down_kbps, p.down_sigma), 0.1 * p.down_kbps)
        up = max(rng.gauss(p.up_kbps, p.up_sigma), 0.1 * p.up_kbps)
        kbits = model_bytes * 8 / 1000.0
        return compute, kbits / down + kbits / up

    def measured(self, client_id: int, now_s: float, samples: int, epochs: int, model_bytes: int,
                 rng: random.Random) -> dict[str, float]:
        """The resource fields a real fl-client reports, from the profile on the virtual clock.

        A simulated client is CPU-bound while computing (cpu_percent 100) and idle while it
        communicates, so its CPU-seconds equal its compute seconds.
        """
        compute, comm = self.round_cost(client_id, now_s, samples, epochs, model_bytes, rng)
        return {"train_time_s": compute, "comm_time_s": comm, "cpu_time_s": compute, "cpu_percent": 100.0}
