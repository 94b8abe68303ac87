"""TiFL (Chai et al., HPDC'20): pick one latency tier per round, then clients at random within it.

From the paper: clients are profiled and grouped into tiers by latency; each tier has a budget of
`credits` (times it may be chosen); every `interval` rounds the tier probabilities are recomputed
from per-tier accuracy: sorted by accuracy ascending, the tier at rank r (0 = worst) of n gets
probability (n - r) / (n (n + 1) / 2), so low-accuracy tiers are chosen more. Ours: profiling is
done by ordinary random rounds until `num_tiers * k` clients are profiled (TiFL profiles all at
once, which is not possible with 100k clients); a tier with fewer than k available members is
topped up from the tiers nearest in latency; with every credit spent, tiers are chosen uniformly.
"""
from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mlsyskit.core.config import require
from mlsyskit.tools.fl.outcome import RoundOutcome
from mlsyskit.tools.fl.scheduling.base import TrackingConfig, TrackingScheduler


@dataclass(frozen=True)
class TiflConfig:
    interval: int = 5  # rounds between probability updates (TiFL's I)
    credits: int = 0  # times each tier may be chosen; 0 = unlimited

    def __post_init__(self) -> None:
        require(self.interval >= 1 and self.credits >= 0, "interval >= 1 and credits >= 0")


class TiflScheduler(TrackingScheduler):
    name = "tifl"

    def __init__(self, config: TiflConfig | None = None, tracking: TrackingConfig | None = None) -> None:
        super().__init__(config or TiflConfig(), tracking)
        n = self.tracking.num_tiers
        self.probs = [1.0 / n] * n
        self.credits = [self.config.credits] * n
        self.chosen_tiers: list[int] = []

    def select(self, round_num: int, available: Sequence[int], k: int, rng: random.Random) -> list[int]:
        ids = self.offer(available)
        profiled = [c for c in ids if self.tiers.tier_of(c) is not None]
        if len(self.tiers.ema) < self.tracking.num_tiers * k or not profiled:
            return sorted(rng.sample(ids, min(k, len(ids))))  # still profiling
        by_tier: dict[int, list[int]] = {}
        for cid in profiled:
            by_tier.setdefault(self.tiers.tier_of(cid), []).append(cid)
        tiers = sorted(by_tier)
        limited = self.config.credits > 0
        weights = [self.probs[t] if not limited or self.credits[t] > 0 else 0.0 for t in tiers]
        if sum(weights) <= 0:
            weights = [1.0] * len(tiers)
        tier = rng.choices(tiers, weights=weights)[0]
        if limited and self.credits[tier] > 0:
            self.credits[tier] -= 1
        self.chosen_tiers.append(tier)
        chosen = rng.sample(by_tier[tier], min(k, len(by_tier[tier])))
        for other in sorted(tiers, key=lambda t: (abs(t - tier), t)):
            if len(chosen) >= k:
                break
            if other != tier:
                chosen += rng.sample(by_tier[other], min(k - len(chosen), len(by_tier[other])))
        return sorted(chosen)

    def observe(self, outcome: RoundOutcome) -> None:
        super().observe(outcome)
        if outcome.round % self.config.interval == 0:
            accuracies = self.tier_accuracies()
            n = self.tracking.num_tiers
            if accuracies:
                # tiers without an accuracy yet rank as worst: they must be tried
                ranked = sorted(range(n), key=lambda t: (accuracies.get(t, -1.0), t))
                total = n * (n + 1) / 2
                self.probs = [0.0] * n
                for rank, t in enumerate(ranked):
                    self.probs[t] = (n - rank) / total

    def state_dict(self) -> dict[str, Any]:
        return super().state_dict() | {"probs": list(self.probs), "credits": list(self.credits),
                                       "chosen_tiers": list(self.chosen_tiers)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.probs = [float(p) for p in state["probs"]]
        self.credits = [int(c) for c in state["credits"]]
        self.chosen_tiers = [int(t) for t in state["chosen_tiers"]]
