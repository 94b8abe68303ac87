"""FedAdam (Reddi et al., ICLR'21, "Adaptive Federated Optimization"): the FedAvg pseudo-gradient applied by
server Adam.

    delta = avg - w
    m <- B1 m + (1 - B1) delta;   v <- B2 v + (1 - B2) delta^2;   w <- w + SERVER_LR * m / (sqrt(v) + TAU)

as in the paper (no bias correction; TAU is its adaptivity constant). m and v are the strategy's
state across rounds (checkpointed). Each coordinate moves by about SERVER_LR per round whatever the
size of the updates, so a scaled update cannot push a coordinate further than an honest one, but it
still sets the direction of the average.
"""
from __future__ import annotations

import numpy as np

from mlsyskit.tools.fl.aggregation import like
from mlsyskit.tools.fl.strategy.fedavg import FedAvg
from mlsyskit.tools.fl.strategy.fedavgm import ServerOptimizer, pseudo_gradient

SERVER_LR = 0.01  # chosen on digits (tuning part, Dirichlet 0.5, seed 0) from 0.003, 0.01, 0.03 (0.855, 0.927, 0.905)
B1, B2, TAU = 0.9, 0.99, 1e-3


class FedAdamRule(ServerOptimizer):
    name = "fedadam"
    buffers = ("m", "v")

    def aggregate(self, global_weights, updates):
        delta = pseudo_gradient(global_weights, updates)
        m, v = self.state["m"], self.state["v"]
        for k, d in delta.items():
            m[k] = B1 * m.get(k, np.zeros_like(d)) + (1 - B1) * d
            v[k] = B2 * v.get(k, np.zeros_like(d)) + (1 - B2) * d * d
        self.steps += 1
        return like(global_weights, {k: global_weights[k] + SERVER_LR * m[k] / (np.sqrt(v[k]) + TAU)
                                     for k in global_weights})


class FedAdam(FedAvg):
    """FedAvg's selection and equal pay, server Adam as the aggregation rule."""

    name = "fedadam"
    rule = FedAdamRule
