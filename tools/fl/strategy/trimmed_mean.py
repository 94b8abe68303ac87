"""Coordinate-wise trimmed mean (Yin et al., ICML'18): per parameter, drop the TRIM_FRACTION largest and
smallest values over the round's updates and average the rest.

With k = floor(TRIM_FRACTION * n) values dropped at each end, up to k Byzantine updates per round
are bounded by honest values in every coordinate. TRIM_FRACTION = 0.2 drops one of five: an
attacker fraction of 0.5 needs 0.4 or more (which makes it the median at five updates). Unweighted,
as the median.
"""
from __future__ import annotations

import numpy as np

from mlsyskit.tools.fl.aggregation import Aggregator, like, stacked
from mlsyskit.tools.fl.strategy.fedavg import FedAvg

TRIM_FRACTION = 0.2  # of the updates, dropped at each end of every coordinate


def trimmed_mean(values: np.ndarray, fraction: float) -> np.ndarray:
    """Mean over axis 0 without the floor(fraction * n) smallest and largest values (at least one kept)."""
    n = values.shape[0]
    k = min(int(fraction * n), (n - 1) // 2)
    ordered = np.sort(values, axis=0)
    return ordered[k:n - k].mean(axis=0)


class TrimmedMeanRule(Aggregator):
    name = "trimmed-mean"
    fraction = TRIM_FRACTION

    def aggregate(self, global_weights, updates):
        if not updates:
            raise ValueError("nothing to aggregate")
        return like(updates[0][0], {k: trimmed_mean(stacked(updates, k), self.fraction) for k in updates[0][0]})


class TrimmedMean(FedAvg):
    """FedAvg's selection and equal pay, the trimmed mean as the aggregation rule."""

    name = "trimmed-mean"
    rule = TrimmedMeanRule
