"""Coordinate-wise median (Yin et al., ICML'18): each parameter of the next model is the median of that
parameter over the round's updates.

Robust while fewer than half of the aggregated updates are Byzantine: in every coordinate the median
lies between two honest values, whatever the others send (a 10x or 1e9x scaled update moves it by at
most one rank). Sample counts are not used (a robust rule cannot trust a weight it cannot check), so
under strong label skew it throws away more honest signal than FedAvg.
"""
from __future__ import annotations

import numpy as np

from mlsyskit.tools.fl.aggregation import Aggregator, like, stacked
from mlsyskit.tools.fl.strategy.fedavg import FedAvg


class MedianRule(Aggregator):
    name = "median"

    def aggregate(self, global_weights, updates):
        if not updates:
            raise ValueError("nothing to aggregate")
        return like(updates[0][0], {k: np.median(stacked(updates, k), axis=0) for k in updates[0][0]})


class Median(FedAvg):
    """FedAvg's selection and equal pay, the median as the aggregation rule."""

    name = "median"
    rule = MedianRule
