"""The default: random selection, FedAvg of every well-formed update, equal pay (TIFF's baseline).

It verifies nothing beyond the format checks every update gets (names, shapes, finite values,
size, metrics), as the paper's baseline and Flower's FedAvg: what it pays and averages is what
TIFF is measured against. The robust baselines (median, trimmed mean, Krum, FedAvgM, FedAdam) are
this strategy with another `rule`.
"""
from __future__ import annotations

from mlsyskit.tools.fl.incentive.equal_pay import EqualPay
from mlsyskit.tools.fl.selection.random_pick import RandomSelector
from mlsyskit.tools.fl.strategy.base import Strategy, Validation


class FedAvg(Strategy):
    name = "fedavg"

    def __init__(self, config, evaluator, validation: Validation | None = None) -> None:
        super().__init__(config, RandomSelector(config.selection), EqualPay(config.economy), evaluator)
