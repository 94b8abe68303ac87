"""Strategy interface in the style of Flower's: configure a round, aggregate it, evaluate.

A strategy composes three separately pluggable parts: a Selector (who trains), an aggregation
rule (which valid updates enter FedAvg) and an Incentive (who gets paid). The Coordinator calls
it; the real server and the simulator drive the same Coordinator, so they share this code.
"""
from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from mlsyskit.tools.fl.aggregation import fedavg
from mlsyskit.tools.fl.config import JobConfig
from mlsyskit.tools.fl.incentive.base import Incentive
from mlsyskit.tools.fl.model import Weights
from mlsyskit.tools.fl.outcome import ClientReport, RoundOutcome
from mlsyskit.tools.fl.selection.base import Selector


class Strategy:
    name = "strategy"

    def __init__(self, config: JobConfig, selector: Selector, incentive: Incentive,
                 evaluator: Callable[[Weights], dict[str, float]]) -> None:
        self.config = config
        self.selector = selector
        self.incentive = incentive
        self._evaluator = evaluator

    def configure_round(self, round_num: int, available: Sequence[int], rng: random.Random) -> list[int]:
        return self.selector.select(round_num, available, self.config.per_round, rng)

    def admitted(self, outcome: RoundOutcome) -> list[ClientReport]:
        """The valid updates that enter the aggregate (all of them, by default)."""
        return outcome.with_status("valid")

    def aggregate(self, global_weights: Weights, updates: dict[int, Weights], outcome: RoundOutcome) -> Weights:
        chosen = self.admitted(outcome)
        for report in chosen:
            report.aggregated = True
        return fedavg([(updates[r.client_id], r.num_samples) for r in chosen]) if chosen else global_weights

    def evaluate(self, weights: Weights) -> dict[str, float]:
        return self._evaluator(weights)
