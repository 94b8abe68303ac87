"""Scale-free FedAdam with its rate from the momentum (`fedadam-sfm`): where the rounds agree the rate is the
pseudo-gradient's RMS (as fedadam-sfcap), where they swing it is the drift alone, and the server's reference
still caps it."""
from __future__ import annotations

import numpy as np

from mlsyskit.tools.fl.strategy import STRATEGIES
from mlsyskit.tools.fl.strategy.fedadam import (
    B1,
    B2,
    TAU_REL_CAPPED,
    CappedScaleFreeAdamRule,
    DriftRateAdamRule,
)

START = {"a": np.zeros((3, 4), np.float32), "b": np.zeros(4, np.float32)}
RNG = np.random.default_rng(2)
DELTA = {"a": RNG.normal(0, 0.05, (3, 4)), "b": RNG.normal(0, 2.0, 4)}
BIG_REF = {k: 100 * d for k, d in DELTA.items()}  # a reference far larger than the updates: the cap does not bind


def rms(a) -> float:
    return float(np.sqrt(np.mean(np.square(a))))


def steps(rule, deltas, reference=BIG_REF):
    """The server's step of each round when the admitted update of round t moves the model by deltas[t]."""
    rule.see_reference(reference)
    weights, out = START, []
    for delta in deltas:
        new = rule.aggregate(weights, [({k: (weights[k] + delta[k]).astype(np.float32) for k in START}, 1)])
        out.append({k: new[k].astype(np.float64) - weights[k] for k in START})
        weights = new
    return out


def test_where_the_rounds_agree_the_rate_is_the_pseudo_gradients_rms_as_in_fedadam_sfcap():
    for got, want in zip(steps(DriftRateAdamRule(), [DELTA] * 4), steps(CappedScaleFreeAdamRule(), [DELTA] * 4), strict=True):
        assert all(np.allclose(got[k], want[k], rtol=1e-4, atol=1e-9) for k in START)


def test_where_the_rounds_swing_the_rate_is_the_drift_and_the_step_shrinks():
    swing = [DELTA, {k: -d for k, d in DELTA.items()}]
    drift, capped = steps(DriftRateAdamRule(), swing)[1], steps(CappedScaleFreeAdamRule(), swing)[1]
    for k, d in DELTA.items():
        # round 2's pseudo-gradient is -d: m = B1 (1 - B1) d - (1 - B1) d, v = (B2 (1 - B2) + (1 - B2)) d^2
        m, v = (B1 * (1 - B1) - (1 - B1)) * d, (B2 * (1 - B2) + (1 - B2)) * d * d
        lr = rms(m) / (1 - B1 ** 2)  # the bias-corrected momentum's RMS, not rms(d)
        assert np.allclose(drift[k], lr * m / (np.sqrt(v) + TAU_REL_CAPPED * lr), rtol=1e-3, atol=1e-9)
        assert rms(drift[k]) < 0.1 * rms(capped[k])


def test_the_reference_still_caps_the_rate_and_tiff_composes_with_the_rule():
    small_ref = {k: 0.01 * d for k, d in DELTA.items()}
    first = steps(DriftRateAdamRule(), [DELTA], small_ref)[0]
    assert all(np.all(np.abs(first[k]) <= rms(small_ref[k]) * (1 + 1e-6)) for k in START)
    assert STRATEGIES.get("tiff+fedadam-sfm").rule is DriftRateAdamRule
