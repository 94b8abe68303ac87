"""TIFF with verified work: trusted selection with exploration, server-verified quality, floor-gated
aggregation, quality-weighted pay once the model has learnt something, consumer refunds.

* Every update is verified before its receipt (incentive/verify.py); the verified quality (its
  alignment with the server's reference update) replaces the claimed one everywhere.
* When the round closes every update's size is bounded (verify.bound: scaled down to the round's
  bound, its verified quality discounted by the same factor), so an inflated update is accepted but
  weighs no more than an honest one and earns as little as its bounded worth.
* Updates under the round's quality floor are left out of the aggregate as well as out of pay:
  with verified quality an honest update under skew still aligns with the reference, while a
  label-flipper's or noisy labeller's barely does (measured in docs/tiff.md).
* The pot goes to verified work (incentive/earned_pot.py): what a refused or under-floor update forfeits
  is shared by the paid providers; only undelivered slots and unverified rounds refund consumers.
* TIFF composes with any aggregation rule: `tiff+median`, `tiff+krum`, ... (with_rule) are TIFF's
  selection, verification, bound, floor and pay with that rule over the admitted updates.
* Pay by quality starts once the global model (the one the providers trained from) beats chance
  on the validation split by CHANCE_MARGIN; before, every provider in the paid set gets one slot.
"""
from __future__ import annotations

from mlsyskit.tools.fl.aggregation import Aggregator
from mlsyskit.tools.fl.incentive.earned_pot import EarnedPot
from mlsyskit.tools.fl.incentive.verify import UpdateVerifier
from mlsyskit.tools.fl.outcome import ClientReport, RoundOutcome
from mlsyskit.tools.fl.selection.trusted_random import TrustedRandomSelector
from mlsyskit.tools.fl.strategy.base import Strategy, Validation

CHANCE_MARGIN = 0.1  # accuracy points over the majority-class rate before quality decides pay


class Tiff(Strategy):
    name = "tiff"

    def __init__(self, config, evaluator, validation: Validation | None = None) -> None:
        if validation is None:
            raise ValueError("tiff needs the server's validation split to verify updates")
        verifier = UpdateVerifier(validation.data, config.train, validation.num_features, validation.num_classes)
        super().__init__(config, TrustedRandomSelector(config.selection), EarnedPot(config.economy), evaluator,
                         verifier)
        self.validation = validation
        self.pay_by_quality = False
        self.aggregator.see_validation(validation.accuracy)

    def prepare_round(self, round_num, weights, seed) -> None:
        super().prepare_round(round_num, weights, seed)
        self.pay_by_quality = self.validation.accuracy(weights) >= self.validation.chance + CHANCE_MARGIN

    def admitted(self, outcome: RoundOutcome) -> list[ClientReport]:
        outcome.pay_by_quality = self.pay_by_quality  # read by the incentive when it pays this round
        return self.incentive.paid_set(outcome)


def with_rule(rule: type[Aggregator]) -> type[Tiff]:
    """TIFF with `rule` aggregating the admitted, bounded updates; registered as `tiff+<rule name>`."""
    return type(f"Tiff_{rule.__name__}", (Tiff,), {
        "name": f"tiff+{rule.name}", "rule": rule, "__module__": __name__,
        "__doc__": f"TIFF's selection, verification, bound, floor and pay; {rule.name} aggregates."})
