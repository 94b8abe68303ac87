"""The default: random selection, FedAvg of every valid update, equal pay (TIFF's baseline)."""
from __future__ import annotations

from mlsyskit.tools.fl.incentive.equal_pay import EqualPay
from mlsyskit.tools.fl.selection.random_pick import RandomSelector
from mlsyskit.tools.fl.strategy import STRATEGIES
from mlsyskit.tools.fl.strategy.base import Strategy


@STRATEGIES.register("fedavg")
class FedAvg(Strategy):
    name = "fedavg"

    def __init__(self, config, evaluator) -> None:
        super().__init__(config, RandomSelector(config.selection), EqualPay(config.economy), evaluator)
