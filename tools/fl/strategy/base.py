"""Strategy interface in the style of Flower's: configure a round, verify its updates, aggregate, evaluate.

A strategy composes separately pluggable parts: a Selector (who trains), an optional
UpdateVerifier (which updates the server can vouch for, their verified quality, and the bound on
their size), an admission rule (which valid updates are aggregated), an aggregation rule
(`rule`: an Aggregator, FedAvg by default; the robust rules are one file each beside this one)
and an Incentive (who gets paid). The Coordinator calls it; the real server and the simulator
drive the same Coordinator, so they share this code.

A round's updates go: verify (each, before its receipt) -> bound (all of the round's, when the
round closes: the verifier scales every update down to the round's size bound and discounts its
verified quality, and its sample weight in the aggregate, by the same factor) -> admitted ->
rule.aggregate -> pay.
"""
from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from mlsyskit.tools.fl.aggregation import Aggregator
from mlsyskit.tools.fl.config import JobConfig
from mlsyskit.tools.fl.data import ClientData
from mlsyskit.tools.fl.incentive.base import Incentive
from mlsyskit.tools.fl.incentive.verify import Reference, UpdateVerifier, Verdict
from mlsyskit.tools.fl.model import Weights
from mlsyskit.tools.fl.outcome import ClientReport, RoundOutcome
from mlsyskit.tools.fl.selection.base import Selector


@dataclass(frozen=True)
class Validation:
    """The server's own labelled split (never a client's data, never the reported test set)."""

    data: ClientData  # samples in x_train / y_train
    num_features: int
    num_classes: int
    accuracy: Callable[[Weights], float]  # of a model on this split

    @property
    def chance(self) -> float:
        """Accuracy of always answering the most frequent class."""
        y = self.data.y_train
        return float(max((y == c).mean() for c in set(y.tolist()))) if len(y) else 0.0


def per_tensor(reference: Reference) -> dict[str, np.ndarray]:
    """The reference update (flattened in the model's order, model.flatten) split back into its tensors."""
    out, at = {}, 0
    for name, w in reference.weights.items():
        out[name] = reference.delta[at:at + w.size].reshape(w.shape)
        at += w.size
    return out


WEIGHT_POWER = 1  # an update bounded by f weighs n * f ** WEIGHT_POWER in the aggregate


class Strategy:
    name = "strategy"
    rule: type[Aggregator] = Aggregator  # the aggregation rule (FedAvg)

    def __init__(self, config: JobConfig, selector: Selector, incentive: Incentive,
                 evaluator: Callable[[Weights], dict[str, float]], verifier: UpdateVerifier | None = None) -> None:
        self.config = config
        self.selector = selector
        self.incentive = incentive
        self.verifier = verifier
        self._evaluator = evaluator
        self._reference: Reference | None = None
        self.aggregator = self.rule()

    def configure_round(self, round_num: int, available: Sequence[int], rng: random.Random) -> list[int]:
        return self.selector.select(round_num, available, self.config.per_round, rng)

    def prepare_round(self, round_num: int, weights: Weights, seed: int) -> None:
        """Called with the model the round's providers start from, before any update arrives."""
        self._reference = self.verifier.reference(weights, seed) if self.verifier is not None else None

    def verify(self, weights: Weights, num_samples: int) -> Verdict | None:
        """The server's check of one well-formed update (None: this strategy verifies nothing)."""
        if self.verifier is None or self._reference is None:
            return None
        return self.verifier.check(self._reference, weights, num_samples)

    def state_dict(self) -> dict:
        """What the strategy itself learns across rounds (checkpointed with the round)."""
        state = {"aggregator": self.aggregator.state_dict()}
        return state | ({"verifier": self.verifier.state_dict()} if self.verifier is not None else {})

    def load_state_dict(self, state: dict) -> None:
        if self.verifier is not None and "verifier" in state:
            self.verifier.load_state_dict(state["verifier"])
        self.aggregator.load_state_dict(state.get("aggregator", {}))

    def bound(self, updates: dict[int, Weights], outcome: RoundOutcome) -> dict[int, tuple[Weights, float]]:
        """The round's valid updates with their size bounded (verifier.bound) and their aggregation weight
        (samples x the factor the size was scaled by); unchanged without a verifier. A bounded update's
        verified quality is discounted by the same factor."""
        valid = {r.client_id: r for r in outcome.with_status("valid")}
        if self.verifier is None or self._reference is None:
            return {cid: (updates[cid], float(r.num_samples)) for cid, r in valid.items()}
        bounded, factors = self.verifier.bound(self._reference, {cid: (updates[cid], r.num_samples)
                                                                 for cid, r in valid.items()})
        for cid, factor in factors.items():
            report = valid[cid]
            if report.verified_quality is not None:
                report.verified_quality *= factor
        return {cid: (bounded[cid], valid[cid].num_samples * factors[cid] ** WEIGHT_POWER) for cid in valid}

    def admitted(self, outcome: RoundOutcome) -> list[ClientReport]:
        """The valid updates that enter the aggregate (all of them, by default)."""
        return outcome.with_status("valid")

    def aggregate(self, global_weights: Weights, updates: dict[int, Weights], outcome: RoundOutcome) -> Weights:
        bounded = self.bound(updates, outcome)
        chosen = self.admitted(outcome)
        for report in chosen:
            report.aggregated = True
        if not chosen:
            return global_weights
        self.aggregator.see_reference(per_tensor(self._reference) if self._reference is not None else None)
        return self.aggregator.aggregate(global_weights, [bounded[r.client_id] for r in chosen])

    def evaluate(self, weights: Weights) -> dict[str, float]:
        return self._evaluator(weights)
