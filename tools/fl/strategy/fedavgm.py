"""FedAvgM (Hsu et al. 2019): FedAvg's average as a pseudo-gradient, applied by server SGD with momentum.

Per round, with w the global model and avg the sample-weighted average of the admitted updates:

    delta = avg - w;   v <- MOMENTUM * v + delta;   w <- w + SERVER_LR * v

SERVER_LR = 1 with MOMENTUM = 0 is FedAvg. The momentum buffer v is the strategy's state across rounds
(checkpointed with the round). Not a robust rule: it damps the round-to-round swing of strong label
skew, and a scaled update moves it as it moves FedAvg (bound the updates first: TIFF does).
"""
from __future__ import annotations

import numpy as np

from mlsyskit.core.rpc_codec import decode, encode
from mlsyskit.tools.fl.aggregation import Aggregator, fedavg, like
from mlsyskit.tools.fl.strategy.fedavg import FedAvg

SERVER_LR = 1.0
MOMENTUM = 0.9  # Hsu et al.'s; on digits (tuning part, Dirichlet 0.5, seed 0) 0.9 > 0 > 0.5 (0.933, 0.922, 0.899)


def pseudo_gradient(global_weights, updates) -> dict[str, np.ndarray]:
    """avg - w per parameter, in float64."""
    avg = fedavg(updates)
    return {k: avg[k].astype(np.float64) - global_weights[k].astype(np.float64) for k in global_weights}


class ServerOptimizer(Aggregator):
    """A server optimiser's per-parameter buffers, checkpointed as raw arrays (core.rpc_codec, never pickle)."""

    buffers: tuple[str, ...] = ()

    def __init__(self) -> None:
        self.state: dict[str, dict[str, np.ndarray]] = {b: {} for b in self.buffers}
        self.steps = 0

    def state_dict(self) -> dict:
        return {"steps": self.steps, "buffers": encode(self.state)}

    def load_state_dict(self, state: dict) -> None:
        if "buffers" in state:
            self.steps, self.state = int(state["steps"]), decode(state["buffers"])


class FedAvgMRule(ServerOptimizer):
    name = "fedavgm"
    buffers = ("velocity",)

    def aggregate(self, global_weights, updates):
        delta = pseudo_gradient(global_weights, updates)
        velocity = self.state["velocity"]
        for k, d in delta.items():
            velocity[k] = MOMENTUM * velocity.get(k, np.zeros_like(d)) + d
        self.steps += 1
        return like(global_weights, {k: global_weights[k] + SERVER_LR * velocity[k] for k in global_weights})


class FedAvgM(FedAvg):
    """FedAvg's selection and equal pay, server momentum as the aggregation rule."""

    name = "fedavgm"
    rule = FedAvgMRule
