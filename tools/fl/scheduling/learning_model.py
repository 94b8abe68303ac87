"""A cheap synthetic learning-curve model for the scheduling harness: a model, not training.

It exists to check the direction of the scheduler's knobs in tests in milliseconds, and is not
evidence for the issue's accuracy or time-to-accuracy targets. Assumptions, all ours:
- Clients belong to one of `groups` data distributions (think label-skew clusters). With
  probability `speed_correlation` a client's group follows its phone's speed rank (newer phones,
  other users, other data), else it is uniform; this is what makes speed-only selection biased.
- The global model has a skill s_g in [0, 1] per group. An on-time update of n samples from group
  g moves s_g by lr * w * (1 - s_g), and every other group by transfer * lr * w * (1 - s_h), with
  w = n / (mean_samples * per_round); a round without updates from a group lets it decay by
  `forget` * s_h (the model drifts to what it trains on). Diminishing returns give plateaus.
- Accuracy on group g is chance + (ceiling - chance) * s_g; a client's accuracy adds a fixed
  per-client offset (sd `client_spread`); the global accuracy weights groups by population share.
- Loss for Oort's utility is -ln(client accuracy); loss_sq_mean adds a variance term.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass

from mlsyskit.core.config import require
from mlsyskit.core.sim import sub_seed
from mlsyskit.tools.fl.scheduling.resources import ResourceModel


@dataclass(frozen=True)
class CurveConfig:
    groups: int = 5
    speed_correlation: float = 0.8
    lr: float = 0.5
    transfer: float = 0.3
    forget: float = 0.02
    chance: float = 0.1
    ceiling: float = 0.9
    client_spread: float = 0.02
    mean_samples: int = 100

    def __post_init__(self) -> None:
        require(self.groups >= 1 and self.mean_samples >= 1, "groups and mean_samples must be >= 1")
        require(0 <= self.speed_correlation <= 1 and 0 <= self.transfer <= 1 and 0 <= self.forget < 1,
                "speed_correlation and transfer in [0, 1], forget in [0, 1)")
        require(0 <= self.chance < self.ceiling <= 1 and self.lr > 0, "0 <= chance < ceiling <= 1, lr > 0")


class LearningCurve:
    def __init__(self, config: CurveConfig, resources: ResourceModel, seed: int) -> None:
        self.config, self.resources, self.seed = config, resources, seed
        self.skill = [0.0] * config.groups

    def _rng(self, client_id: int) -> random.Random:
        return random.Random(sub_seed(self.seed, f"fl-sched/curve/{client_id}"))

    def group(self, client_id: int) -> int:
        rng, g = self._rng(client_id), self.config.groups
        if rng.random() < self.config.speed_correlation:
            return min(g - 1, int(self.resources.speed_quantile(client_id) * g))
        return rng.randrange(g)

    def samples(self, client_id: int) -> int:
        rng = self._rng(client_id)
        rng.random()  # the group draw
        return max(1, round(self.config.mean_samples * rng.lognormvariate(-0.125, 0.5)))

    def _offset(self, client_id: int) -> float:
        return random.Random(sub_seed(self.seed, f"fl-sched/offset/{client_id}")).gauss(0.0, self.config.client_spread)

    def group_accuracy(self, group: int) -> float:
        c = self.config
        return c.chance + (c.ceiling - c.chance) * self.skill[group]

    def client_accuracy(self, client_id: int) -> float:
        return min(1.0, max(0.0, self.group_accuracy(self.group(client_id)) + self._offset(client_id)))

    def global_accuracy(self, group_shares: list[float]) -> float:
        return sum(share * self.group_accuracy(g) for g, share in enumerate(group_shares))

    def loss(self, client_id: int) -> tuple[float, float]:
        """(mean loss, mean squared loss) of the global model on the client's data."""
        loss = -math.log(max(self.client_accuracy(client_id), 1e-3))
        return loss, loss * loss * 1.25

    def apply(self, updates: list[tuple[int, int]], per_round: int) -> None:
        """Apply the round's on-time updates, each (client id, samples)."""
        c = self.config
        trained = set()
        for client_id, samples in updates:
            w = min(1.0, samples / (c.mean_samples * per_round))
            own = self.group(client_id)
            trained.add(own)
            for g in range(c.groups):
                step = c.lr * w * (1 if g == own else c.transfer)
                self.skill[g] += step * (1 - self.skill[g])
        for g in range(c.groups):
            if g not in trained:
                self.skill[g] *= 1 - c.forget
