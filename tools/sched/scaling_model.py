"""A fitted scalability model (Pollux's throughput model, OSDI'21, without the overlap term).

    compute(m)      = c0 + c1 * m                       per-GPU forward/backward at local batch m
    sync(K, N)      = 0                                 K = 1 GPU
                    = l0 + l1 * (K - 2)                 K GPUs on one node (NVLink/PCIe all-reduce)
                    = n0 + n1 * (K - 2)                 K GPUs over N > 1 nodes (network all-reduce)
    step_time       = compute(m) + sync(K, N)

Each group is an ordinary least-squares fit to the measurements of one application. The model
predicts placements the testbed never ran (5 or 6 GPUs per node on Summit-like nodes);
`ThroughputModel` anchors it to the nearest measurement. `held_out_error` reports how well the
form predicts measured placements it was not fitted on.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

from mlsyskit.core.telemetry import percentile
from mlsyskit.tools.sched.profiles import AppProfile, Row


@dataclass(frozen=True)
class FittedModel:
    c0: float
    c1: float
    l0: float
    l1: float
    n0: float
    n1: float

    def sync_time(self, num_replicas: int, num_nodes: int) -> float:
        if num_replicas <= 1:
            return 0.0
        if num_nodes <= 1:
            return max(0.0, self.l0 + self.l1 * (num_replicas - 2))
        return max(0.0, self.n0 + self.n1 * (num_replicas - 2))

    def compute_time(self, local_bsz: float) -> float:
        return max(1e-6, self.c0 + self.c1 * local_bsz)

    def step_time(self, num_replicas: int, num_nodes: int, local_bsz: float) -> float:
        return self.compute_time(local_bsz) + self.sync_time(num_replicas, num_nodes)


def _linear_fit(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    if len(x) == 0:
        return 0.0, 0.0
    if len(set(x.tolist())) < 2:
        return float(np.mean(y)), 0.0
    a = np.stack([np.ones_like(x), x], axis=1)
    (b0, b1), *_ = np.linalg.lstsq(a, y, rcond=None)
    return float(b0), float(b1)


def fit(rows: list[Row]) -> FittedModel:
    rows = list(rows)
    m = np.array([r.local_bsz for r in rows])
    compute = np.array([r.step_time - r.sync_time for r in rows])
    c0, c1 = _linear_fit(m, compute)
    local = [r for r in rows if r.num_nodes == 1 and r.num_replicas > 1]
    multi = [r for r in rows if r.num_nodes > 1]
    l0, l1 = _linear_fit(np.array([r.num_replicas - 2.0 for r in local]), np.array([r.sync_time for r in local]))
    n0, n1 = _linear_fit(np.array([r.num_replicas - 2.0 for r in multi]), np.array([r.sync_time for r in multi]))
    return FittedModel(c0, c1, l0, l1, n0, n1)


def held_out_error(profile: AppProfile, holdout: float = 0.2, seed: int = 0) -> dict[str, float]:
    """Fit on a seeded random 1-holdout share of the measured configurations, predict the rest.

    Whole configurations are held out (every batch size of a placement), so the score measures
    prediction of unseen placements, not interpolation between batch sizes of a seen one."""
    keys = sorted({(r.shape or (), r.num_nodes, r.num_replicas) for r in profile.rows})
    rng = random.Random(seed)
    rng.shuffle(keys)
    test_keys = set(keys[: max(1, int(len(keys) * holdout))])
    train = [r for r in profile.rows if (r.shape or (), r.num_nodes, r.num_replicas) not in test_keys]
    test = [r for r in profile.rows if (r.shape or (), r.num_nodes, r.num_replicas) in test_keys]
    model = fit(train)
    errors = np.array([abs(model.step_time(r.num_replicas, r.num_nodes, r.local_bsz) - r.step_time) / r.step_time
                       for r in test])
    return {"app": profile.name, "train_rows": len(train), "test_rows": len(test),
            "mape": float(errors.mean()), "p90_ape": percentile(errors.tolist(), 90)}
