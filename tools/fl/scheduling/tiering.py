"""Profiling and tiering by latency (TiFL's idea), with re-tiering on a period or on drift.

Each client's round latency is smoothed by an EMA. Tiers are latency quantiles over the
profiled clients: tier 0 is the fastest. A client keeps its tier until the next re-tiering, which
happens every `retier_every` rounds, or earlier when the distribution drifts: more than
`drift_fraction` of profiled clients have an EMA outside their tier's latency band (widened by
`drift_slack`), or when the profiled clients grew by more than `drift_fraction`. A client first
measured between re-tierings joins the tier its latency falls in.
Unprofiled clients have no tier (None); schedulers decide how to explore them.
"""
from __future__ import annotations

import bisect
from collections.abc import Iterable
from typing import Any

from mlsyskit.core.config import require
from mlsyskit.core.telemetry import percentile


class LatencyTiers:
    def __init__(self, num_tiers: int = 5, ema_beta: float = 0.5, retier_every: int = 10,
                 drift_fraction: float = 0.1, drift_slack: float = 0.25) -> None:
        require(num_tiers >= 1, "num_tiers must be >= 1")
        require(0 < ema_beta <= 1, "ema_beta must be in (0, 1]")
        require(retier_every >= 1, "retier_every must be >= 1")
        require(0 < drift_fraction <= 1 and drift_slack >= 0, "drift_fraction in (0, 1], drift_slack >= 0")
        self.num_tiers, self.ema_beta, self.retier_every = num_tiers, ema_beta, retier_every
        self.drift_fraction, self.drift_slack = drift_fraction, drift_slack
        self.ema: dict[int, float] = {}
        self.tier: dict[int, int] = {}
        self.bounds: list[float] = []  # upper latency bound of tiers 0..n-2
        self.last_retier = 0
        self.retiers = 0
        self.tiered_count = 0  # profiled clients at the last re-tiering

    def observe(self, client_id: int, latency_s: float) -> None:
        old = self.ema.get(client_id)
        self.ema[client_id] = latency_s if old is None else (1 - self.ema_beta) * old + self.ema_beta * latency_s
        if client_id not in self.tier:
            self.tier[client_id] = self._band(self.ema[client_id])

    def _band(self, latency: float) -> int:
        return bisect.bisect_left(self.bounds, latency)

    def tier_of(self, client_id: int) -> int | None:
        return self.tier.get(client_id)

    def members(self, tier: int, among: Iterable[int]) -> list[int]:
        return [cid for cid in among if self.tier.get(cid) == tier]

    def expected_latency(self, client_id: int) -> float | None:
        return self.ema.get(client_id)

    def retier(self, round_num: int) -> None:
        values = sorted(self.ema.values())
        n = min(self.num_tiers, len(values))
        self.bounds = [percentile(values, 100 * (i + 1) / n, presorted=True) for i in range(n - 1)]
        self.tier = {cid: self._band(v) for cid, v in self.ema.items()}
        self.last_retier = round_num
        self.retiers += 1
        self.tiered_count = len(self.ema)

    def drifted(self) -> bool:
        if not self.tier:
            return False
        lows = [0.0, *self.bounds]
        highs = [*self.bounds, float("inf")]
        misplaced = 0
        for cid, latency in self.ema.items():
            t = self.tier[cid]
            if latency < lows[t] * (1 - self.drift_slack) or latency > highs[t] * (1 + self.drift_slack):
                misplaced += 1
        return misplaced > self.drift_fraction * len(self.ema)

    def maybe_retier(self, round_num: int) -> bool:
        """Re-tier if the period passed, many clients were newly profiled, or the distribution drifted."""
        grown = len(self.ema) > (1 + self.drift_fraction) * self.tiered_count
        if self.ema and (round_num - self.last_retier >= self.retier_every or grown or self.drifted()):
            self.retier(round_num)
            return True
        return False

    def state_dict(self) -> dict[str, Any]:
        return {"ema": {str(k): v for k, v in self.ema.items()}, "tier": {str(k): v for k, v in self.tier.items()},
                "bounds": list(self.bounds), "last_retier": self.last_retier, "retiers": self.retiers,
                "tiered_count": self.tiered_count}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.ema = {int(k): float(v) for k, v in state["ema"].items()}
        self.tier = {int(k): int(v) for k, v in state["tier"].items()}
        self.bounds = [float(b) for b in state["bounds"]]
        self.last_retier, self.retiers = int(state["last_retier"]), int(state["retiers"])
        self.tiered_count = int(state["tiered_count"])


def round_deadline(expected_latencies: Iterable[float | None], slack: float, fallback_s: float,
                   profiled_only: bool = False) -> float:
    """A round's deadline: `slack` x the slowest expected latency among the selected clients.

    Unprofiled clients count as `fallback_s`, or, with `profiled_only`, not at all: an explored client
    must then fit the round the profiled ones set, and if it is late it is measured as late (so a slow
    newcomer costs one round's wasted work, not one round stretched to `fallback_s`). With nobody
    profiled the deadline is `fallback_s`.
    """
    require(slack >= 1 and fallback_s > 0, "deadline slack must be >= 1 and fallback positive")
    latencies = list(expected_latencies)
    known = [v for v in latencies if v is not None] if profiled_only else \
        [fallback_s if v is None else v for v in latencies]
    return slack * max(known) if known else fallback_s
