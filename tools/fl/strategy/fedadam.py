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

`fedadam-sfcap` (ours) caps that rate at the RMS of the server's own reference update of the tensor (TIFF's
FLTrust reference, trained on the server's validation split; Aggregator.see_reference), so the admitted updates
can only lower it. Chosen on digits with tau 1e-2 x lr (TAU_REL_CAPPED) against a rate from the reference alone;
on held-out data it misses the same two strong-skew cells as fedadam-sf (README, issue 21). Being capped by
the reference, it needs TIFF's verifier: offered only as `tiff+fedadam-sfcap`.

Two more, tried on digits against fedadam-sfcap (Dirichlet 0.05 and 1.0, none and half scaled, seeds 0-2; mean
kept accuracy 0.886) and not chosen: `fedadam-sfm`, the rate from the bias-corrected momentum (the drift the
rounds agree on) instead of this round's pseudo-gradient (0.855), and `fedadam-sfv`, which takes each round the
rate of those two whose step scores higher on the server's validation split (0.882). Held out, both do better
where fedadam-sfcap misses most (README, issue 21).
"""
from __future__ import annotations

import numpy as np

from mlsyskit.tools.fl.aggregation import like
from mlsyskit.tools.fl.strategy.fedavg import FedAvg
from mlsyskit.tools.fl.strategy.fedavgm import ServerOptimizer, pseudo_gradient

SERVER_LR = 0.01  # chosen on digits (tuning part, Dirichlet 0.5, seed 0) from 0.003, 0.01, 0.03 (0.855, 0.927, 0.905)
B1, B2, TAU = 0.9, 0.99, 1e-3
TAU_REL = 1e-3  # fedadam-sf: tau as a fraction of the tensor's lr (the paper's tau relative to its lr scale)
# fedadam-sfcap: chosen on digits (Dirichlet 0.05/1.0, none/50% scaled, seeds 0-2) from 1e-3, 1e-2, 1e-1: mean kept
# accuracy 0.884, 0.886, 0.866 (a larger tau moves the coordinates that barely changed less than sign-like Adam does)
TAU_REL_CAPPED = 1e-2


class FedAdamRule(ServerOptimizer):
    name = "fedadam"
    buffers = ("m", "v")

    def aggregate(self, global_weights, updates):
        delta = self.moments(global_weights, updates)
        moved = self.moved(global_weights, delta, self.rate)
        self.steps += 1
        return moved

    def moments(self, global_weights, updates) -> dict[str, np.ndarray]:
        """This round's pseudo-gradient, folded into the moments m and v."""
        delta = pseudo_gradient(global_weights, updates)
        m, v = self.state["m"], self.state["v"]
        for k, d in delta.items():
            m[k] = B1 * m.get(k, np.zeros_like(d)) + (1 - B1) * d
            v[k] = B2 * v.get(k, np.zeros_like(d)) + (1 - B2) * d * d
        return delta

    def moved(self, global_weights, delta, rate):
        """The model after one Adam step with per-tensor (lr, tau) = rate(name, delta of the tensor)."""
        m, v, step = self.state["m"], self.state["v"], {}
        for k, d in delta.items():
            lr, tau = rate(k, d)
            step[k] = lr * m[k] / (np.sqrt(v[k]) + tau) if lr > 0 else np.zeros_like(d)
        return like(global_weights, {k: global_weights[k] + step[k] for k in global_weights})

    def rate(self, name: str, delta: np.ndarray) -> tuple[float, float]:
        """(lr, tau) of one parameter tensor (`name`, this round's pseudo-gradient `delta`)."""
        return SERVER_LR, TAU


def rms(a: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(a, dtype=np.float64)))) if a.size else 0.0


class ScaleFreeAdamRule(FedAdamRule):
    name = "fedadam-sf"
    tau_rel = TAU_REL

    def rate(self, name, delta):
        lr = rms(delta)
        return lr, self.tau_rel * lr


class CappedScaleFreeAdamRule(ScaleFreeAdamRule):
    """fedadam-sfcap: the scale-free rate of each tensor, never above the RMS of the server's own reference update
    of that tensor (TIFF's FLTrust reference, trained on the server's validation split), so the admitted updates
    can lower the server's step but not raise it past the server's own; the scale-free rate while no reference
    is known. tau = TAU_REL_CAPPED x lr (chosen on digits, see TAU_REL_CAPPED)."""

    name = "fedadam-sfcap"
    tau_rel = TAU_REL_CAPPED

    def __init__(self) -> None:
        super().__init__()
        self.reference: dict[str, np.ndarray] | None = None

    def see_reference(self, delta):
        self.reference = delta

    def rate(self, name, delta):
        if self.reference is None:
            return super().rate(name, delta)
        lr = min(rms(delta), rms(self.reference[name]))
        return lr, self.tau_rel * lr


class DriftRateAdamRule(CappedScaleFreeAdamRule):
    """fedadam-sfm: as fedadam-sfcap, but the scale-free rate is the RMS of the bias-corrected momentum
    m / (1 - B1^t) (the part of the pseudo-gradient the recent rounds agree on) instead of this round's
    pseudo-gradient. Why: under strong skew a round's pseudo-gradient is mostly the pull toward its few clients'
    classes, and its size grows with that disagreement (held-out make_classification, alpha 0.05: RMS 0.045 in
    round 1, 0.32 in round 12, accuracy peaking at round 9), so a rate taken from it grows the step as the rounds
    disagree more. The momentum averages the swings out: where the rounds agree it equals the pseudo-gradient
    (the rate is unchanged), where they swing it is the drift alone. No new constant."""

    name = "fedadam-sfm"

    def rate(self, name, delta):
        drift = rms(self.state["m"][name]) / (1.0 - B1 ** (self.steps + 1))  # m already holds this round's delta
        lr = drift if self.reference is None else min(drift, rms(self.reference[name]))
        return lr, self.tau_rel * lr


class ValidatedRateAdamRule(DriftRateAdamRule):
    """fedadam-sfv: each round two capped scale-free steps from the same moments, one at this round's rate
    (fedadam-sfcap) and one at the drift's (fedadam-sfm), and the server keeps the model that scores higher on its
    own validation split (see_validation; TIFF's FLTrust split, never the test set); the drift's, the smaller
    step, on a tie. Why: which rate is right depends on the data (digits, the tuning part, gains from the larger
    step at Dirichlet 0.05: 0.832 against 0.784 without attackers; the held-out make_classification loses with
    it), and the server holds labelled data to measure that on, round by round. No new constant; one validation
    pass per candidate. Without a validation split it is fedadam-sfcap."""

    name = "fedadam-sfv"

    def __init__(self) -> None:
        super().__init__()
        self.score = None

    def see_validation(self, score):
        self.score = score

    def aggregate(self, global_weights, updates):
        delta = self.moments(global_weights, updates)
        drift_rate, round_rate = super().rate, super(DriftRateAdamRule, self).rate
        if self.score is None:
            moved = self.moved(global_weights, delta, round_rate)
        else:  # max keeps the first of equals: the drift's
            moved = max((self.moved(global_weights, delta, rate) for rate in (drift_rate, round_rate)), key=self.score)
        self.steps += 1
        return moved


class FedAdam(FedAvg):
    """FedAvg's selection and equal pay, server Adam as the aggregation rule."""

    name = "fedadam"
    rule = FedAdamRule
