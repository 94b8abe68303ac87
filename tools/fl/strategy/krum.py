"""Multi-Krum (Blanchard et al., NeurIPS'17): keep the m updates closest to their neighbours, average them.

With n updates of which at most f are Byzantine, each update's score is the sum of its squared
distances to its n - f - 2 nearest others; the m = n - f lowest scores are averaged (sample-weighted,
as FedAvg). An update far from everyone (scaled, noise, flipped) scores high and is left out; Krum
itself is m = 1. f is the largest the guarantee allows, n > 2f + 2: f = (n - 3) // 2 (1 of 5, 2 of 7),
so at 5 updates per round it assumes one attacker; at most n - 2 updates are ever averaged.
"""
from __future__ import annotations

import numpy as np

from mlsyskit.tools.fl.aggregation import Aggregator, fedavg
from mlsyskit.tools.fl.model import flatten
from mlsyskit.tools.fl.strategy.fedavg import FedAvg


def krum_scores(points: np.ndarray, byzantine: int) -> np.ndarray:
    """Krum's score of every row: the sum of squared distances to its n - f - 2 nearest other rows."""
    n = len(points)
    squared = (points ** 2).sum(axis=1)
    distances = np.maximum(squared[:, None] + squared[None, :] - 2.0 * points @ points.T, 0.0)
    neighbours = max(n - byzantine - 2, 1)
    ordered = np.sort(distances, axis=1)[:, 1:]  # without the distance to itself (0, first)
    return ordered[:, :neighbours].sum(axis=1)


def multi_krum(updates, byzantine: int | None = None, keep: int | None = None) -> list[int]:
    """Indices of the updates multi-Krum keeps, best score first."""
    n = len(updates)
    if n <= 2:
        return list(range(n))  # no neighbour to compare with: nothing can be told apart
    f = (n - 3) // 2 if byzantine is None else byzantine
    m = n - f if keep is None else keep
    scores = krum_scores(np.stack([flatten(w) for w, _ in updates]), f)
    return [int(i) for i in np.argsort(scores, kind="stable")[:max(m, 1)]]


class KrumRule(Aggregator):
    name = "krum"

    def aggregate(self, global_weights, updates):
        if not updates:
            raise ValueError("nothing to aggregate")
        return fedavg([updates[i] for i in multi_krum(updates)])


class Krum(FedAvg):
    """FedAvg's selection and equal pay, multi-Krum as the aggregation rule."""

    name = "krum"
    rule = KrumRule
