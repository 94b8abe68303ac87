"""What the simulated world does to a selected client on the virtual clock (pure, seeded).

A client selected at time `now` downloads the model, trains `samples x epochs` samples and uploads
its update; its compute and communication times come from its resource profile at `now`
(scheduling/resources.py: FLASH phones and links, slowdowns that change mid-run). Availability
(scheduling/availability.py, FedScale's trace schema) says when it goes offline: a client that
goes offline before its upload is done drops at that moment, having computed until then. One whose
update would arrive after the round's deadline is late. Both are wasted work: compute spent on an
update that never enters the model. The simulator trains only the on-time clients (a late update
would be thrown away), and reports for every client what a real fl-client measures.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass

from mlsyskit.core.config import ConfigError, require
from mlsyskit.tools.fl.scheduling.availability import (
    AlwaysAvailable,
    Availability,
    SyntheticAvailability,
    load_trace,
)
from mlsyskit.tools.fl.scheduling.resources import ResourceModel, Slowdown


@dataclass(frozen=True)
class WorldConfig:
    availability: str = "always"  # always | synthetic | a FedScale trace file (JSON or data-only pickle)
    mean_on_s: float = 1800.0  # synthetic availability: mean online period
    mean_off_s: float = 600.0  # ... and mean offline period
    always_on_fraction: float = 0.0
    median_rate: float = 200.0  # samples/s of the median FLASH phone (ours)
    slowdown_fraction: float = 0.0  # clients that get one random slowdown episode during the run
    slowdown_range: tuple[float, float] = (2.0, 5.0)
    slowdown_horizon_s: float = 3600.0  # episodes start uniformly in [0, horizon)
    slowdowns: tuple[Slowdown, ...] = ()  # explicit episodes (tests, replays)

    def __post_init__(self) -> None:
        require(self.mean_on_s > 0 and self.mean_off_s > 0, "availability on/off means must be positive")
        require(0 <= self.slowdown_fraction <= 1, "slowdown_fraction must be in [0, 1]")


@dataclass(frozen=True)
class Fate:
    """What happens to one selected client in one round, in seconds from the round's start."""

    client_id: int
    compute_s: float
    comm_s: float
    offline_after_s: float  # inf: stays online through the round

    @property
    def latency_s(self) -> float:
        return self.compute_s + self.comm_s

    @property
    def drops(self) -> bool:
        return self.latency_s > self.offline_after_s

    @property
    def computed_s(self) -> float:
        """Compute actually spent (cut short when it went offline)."""
        return min(self.compute_s, self.offline_after_s)

    def measured(self) -> dict[str, float]:
        """The resource fields a real fl-client reports (CPU-bound while computing, idle while sending)."""
        return {"train_time_s": self.computed_s, "comm_time_s": self.comm_s if not self.drops else 0.0,
                "cpu_time_s": self.computed_s, "cpu_percent": 100.0}


class World:
    def __init__(self, config: WorldConfig, seed: int, resources: ResourceModel | None = None,
                 availability: Availability | None = None) -> None:
        """`resources` and `availability`, when given, replace what `config` would build (tests, the harness)."""
        self.config = config
        self.resources = resources or ResourceModel(
            seed, median_rate=config.median_rate, slowdowns=list(config.slowdowns),
            random_slowdown_fraction=config.slowdown_fraction, random_slowdown_range=config.slowdown_range,
            horizon_s=config.slowdown_horizon_s)
        self.availability: Availability
        if availability is not None:
            self.availability = availability
        elif config.availability == "always":
            self.availability = AlwaysAvailable()
        elif config.availability == "synthetic":
            self.availability = SyntheticAvailability(seed, mean_on_s=config.mean_on_s, mean_off_s=config.mean_off_s,
                                                      always_on_fraction=config.always_on_fraction)
        else:
            try:
                self.availability = load_trace(config.availability)
            except OSError as e:
                raise ConfigError(f"availability trace {config.availability}: {e.strerror or e}") from None

    def online(self, population: int, now_s: float) -> list[int]:
        if isinstance(self.availability, AlwaysAvailable):
            return list(range(population))
        return [c for c in range(population) if self.availability.is_active(c, now_s)]

    def fate(self, client_id: int, now_s: float, samples: int, epochs: int, model_bytes: int,
             rng: random.Random) -> Fate:
        compute, comm = self.resources.round_cost(client_id, now_s, samples, epochs, model_bytes, rng)
        until = self.availability.online_until(client_id, now_s)
        return Fate(client_id, compute, comm, until - now_s if math.isfinite(until) else math.inf)
