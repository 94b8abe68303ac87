"""TIFF: quality-history selection with exploration, quality-weighted pay, consumer refunds.

Our addition (not the paper's): updates under the quality floor are also left out of FedAvg,
not only unpaid, since the same signal that says "do not pay for this data" says "do not learn
from it".
"""
from __future__ import annotations

from mlsyskit.tools.fl.incentive.tiff_tokens import TiffTokens
from mlsyskit.tools.fl.outcome import ClientReport, RoundOutcome
from mlsyskit.tools.fl.selection.quality_greedy import QualityGreedySelector
from mlsyskit.tools.fl.strategy import STRATEGIES
from mlsyskit.tools.fl.strategy.base import Strategy


@STRATEGIES.register("tiff")
class Tiff(Strategy):
    name = "tiff"

    def __init__(self, config, evaluator) -> None:
        super().__init__(config, QualityGreedySelector(config.selection), TiffTokens(config.economy), evaluator)

    def admitted(self, outcome: RoundOutcome) -> list[ClientReport]:
        return self.incentive.paid_set(outcome)
