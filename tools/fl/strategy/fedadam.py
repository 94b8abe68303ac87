"""FedAdam (Reddi et al., ICLR'21, "Adaptive Federated Optimization"): the FedAvg pseudo-gradient applied by
server Adam; and its scale-free form, TIFF's default rule.

    delta = avg - w
    m <- B1 m + (1 - B1) delta;   v <- B2 v + (1 - B2) delta^2;   w <- w + lr * m / (sqrt(v) + tau)

`fedadam` is the paper's (no bias correction; tau its adaptivity constant): lr = SERVER_LR, tau = TAU.
Each coordinate moves by about SERVER_LR per round whatever the size of the updates, so a scaled update
cannot push a coordinate further than an honest one, but it still sets the direction of the average.
A fixed lr is a scale, chosen for one model and dataset: 0.01 (chosen on digits) was too slow for
MNIST-1D in 20 rounds (11.6 points under FedAvg without attackers, issue 21).

`fedadam-sf` (scale-free, ours) takes the lr of each parameter tensor from this round's pseudo-gradient:
lr = RMS(delta) of that tensor, tau = TAU_REL * lr. In its first round it moves every coordinate by the
tensor's RMS step in the sign of delta (the same norm as FedAvg's step); where the rounds agree, m / sqrt(v)
grows to about 2 (no bias correction), so it moves up to twice as far as FedAvg; where they disagree (strong
label skew: each round's few clients pull toward their own classes), m averages the swings out and the
step shrinks. It has no constant that depends on the model or the data. Not robust on its own: a scaled
update inflates delta and so the lr. TIFF bounds every update's size first, which is why it is TIFF's
rule (`tiff+fedadam-sf`, the default strategy), not one of the robust baselines.
"""
from __future__ import annotations

import numpy as np

from mlsyskit.tools.fl.aggregation import like
from mlsyskit.tools.fl.strategy.fedavg import FedAvg
from mlsyskit.tools.fl.strategy.fedavgm import ServerOptimizer, pseudo_gradient

SERVER_LR = 0.01  # chosen on digits (tuning part, Dirichlet 0.5, seed 0) from 0.003, 0.01, 0.03 (0.855, 0.927, 0.905)
B1, B2, TAU = 0.9, 0.99, 1e-3
TAU_REL = 1e-3  # fedadam-sf: tau as a fraction of the tensor's lr (the paper's tau relative to its lr scale)


class FedAdamRule(ServerOptimizer):
    name = "fedadam"
    buffers = ("m", "v")

    def aggregate(self, global_weights, updates):
        delta = pseudo_gradient(global_weights, updates)
        m, v = self.state["m"], self.state["v"]
        step = {}
        for k, d in delta.items():
            m[k] = B1 * m.get(k, np.zeros_like(d)) + (1 - B1) * d
            v[k] = B2 * v.get(k, np.zeros_like(d)) + (1 - B2) * d * d
            lr, tau = self.rate(d)
            step[k] = lr * m[k] / (np.sqrt(v[k]) + tau) if lr > 0 else np.zeros_like(d)
        self.steps += 1
        return like(global_weights, {k: global_weights[k] + step[k] for k in global_weights})

    def rate(self, delta: np.ndarray) -> tuple[float, float]:
        """(lr, tau) of one parameter tensor this round."""
        return SERVER_LR, TAU


class ScaleFreeAdamRule(FedAdamRule):
    name = "fedadam-sf"

    def rate(self, delta):
        lr = float(np.sqrt(np.mean(delta * delta))) if delta.size else 0.0
        return lr, TAU_REL * lr


class FedAdam(FedAvg):
    """FedAvg's selection and equal pay, server Adam as the aggregation rule."""

    name = "fedadam"
    rule = FedAdamRule
