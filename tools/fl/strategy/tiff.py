"""TIFF: quality-history selection with exploration, quality-weighted pay, consumer refunds.

Aggregation stays sample-weighted FedAvg over every valid update. We tried also leaving updates
under the quality floor out of FedAvg: on Dirichlet-skewed digits it cost accuracy (honest
clients whose classes the model has not learned yet score low too, so excluding them starves
those classes), while the selector already keeps label-flippers out of most rounds.
"""
from __future__ import annotations

from mlsyskit.tools.fl.incentive.tiff_tokens import TiffTokens
from mlsyskit.tools.fl.selection.quality_greedy import QualityGreedySelector
from mlsyskit.tools.fl.strategy import STRATEGIES
from mlsyskit.tools.fl.strategy.base import Strategy


@STRATEGIES.register("tiff")
class Tiff(Strategy):
    name = "tiff"

    def __init__(self, config, evaluator) -> None:
        super().__init__(config, QualityGreedySelector(config.selection), TiffTokens(config.economy), evaluator)
