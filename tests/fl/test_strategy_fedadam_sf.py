"""Scale-free FedAdam (`fedadam-sf`; TIFF's default rule is this one capped by the reference): its step follows the size of the round's
pseudo-gradient (no server learning rate to tune), never moves slower than FedAvg where the rounds agree,
damps rounds that disagree, and its buffers survive a checkpoint."""
from __future__ import annotations

import numpy as np

from mlsyskit.tools.fl.aggregation import fedavg
from mlsyskit.tools.fl.strategy import DEFAULT_STRATEGY, STRATEGIES
from mlsyskit.tools.fl.strategy.fedadam import TAU_REL, FedAdamRule, ScaleFreeAdamRule


def rounds(rule, start, deltas):
    """Apply one update per round (delta relative to the current model); the models after each round."""
    models, model = [], start
    for delta in deltas:
        model = rule.aggregate(model, [({k: (model[k] + delta[k]).astype(np.float32) for k in model}, 1)])
        models.append(model)
    return models


def norm(a, b) -> float:
    return float(np.sqrt(sum(np.sum((a[k].astype(np.float64) - b[k]) ** 2) for k in a)))


START = {"a": np.zeros((3, 4), np.float32), "b": np.zeros(4, np.float32)}
RNG = np.random.default_rng(0)
DELTA = {"a": RNG.normal(0, 0.05, (3, 4)), "b": RNG.normal(0, 2.0, 4)}  # two tensors of very different scale


def test_first_step_has_fedavgs_norm_per_tensor_in_the_sign_of_the_pseudo_gradient():
    (first,) = rounds(ScaleFreeAdamRule(), START, [DELTA])
    for k, d in DELTA.items():
        step = first[k] - START[k]
        rms = np.sqrt(np.mean(d ** 2))
        # m = 0.1 d, sqrt(v) = 0.1 |d|, tau = TAU_REL rms: rms * d / (|d| + 10 TAU_REL rms), ~rms * sign(d)
        assert np.allclose(step, rms * d / (np.abs(d) + 10 * TAU_REL * rms), rtol=1e-4)
        assert (np.sign(step) == np.sign(d)).all() and np.all(np.abs(step) <= rms)
        assert abs(np.linalg.norm(step) - np.linalg.norm(d)) <= 0.05 * np.linalg.norm(d)
    assert first["a"].dtype == np.float32 and first["b"].shape == (4,)


def test_the_step_scales_with_the_updates_where_fedadams_fixed_lr_does_not():
    small = rounds(ScaleFreeAdamRule(), START, [DELTA] * 3)
    big = rounds(ScaleFreeAdamRule(), START, [{k: 100 * d for k, d in DELTA.items()}] * 3)
    for s, b in zip(small, big, strict=True):  # exactly proportional: no constant carries a scale
        assert np.allclose(b["a"], 100 * s["a"], rtol=1e-4) and np.allclose(b["b"], 100 * s["b"], rtol=1e-4)
    fixed = rounds(FedAdamRule(), START, [{k: 100 * d for k, d in DELTA.items()}] * 3)
    assert norm(fixed[-1], START) < 0.2 * norm(big[-1], START)  # fedadam's lr 0.01 caps it whatever the scale


def test_never_slower_than_fedavg_while_the_rounds_agree_and_slower_when_they_swing():
    agree = rounds(ScaleFreeAdamRule(), START, [DELTA] * 6)
    fedavg_path = 6 * np.sqrt(sum(np.sum(d ** 2) for d in DELTA.values()))  # FedAvg: the whole delta each round
    assert norm(agree[-1], START) >= fedavg_path
    steps = [norm(b, a) for a, b in zip([START, *agree], agree, strict=False)]
    assert all(s >= 0.99 * steps[0] for s in steps)  # no round moves less than the first (FedAvg's norm)
    swing = rounds(ScaleFreeAdamRule(), START, [{k: (-1) ** t * d for k, d in DELTA.items()} for t in range(6)])
    # FedAvg would go back and forth by the whole delta; the momentum cancels most of the swing
    last = norm(swing[-1], swing[-2])
    assert last < 0.5 * np.sqrt(sum(np.sum(d ** 2) for d in DELTA.values()))


def test_a_tensor_that_did_not_move_stays_put_and_the_average_is_fedavgs():
    (out,) = rounds(ScaleFreeAdamRule(), START, [{"a": DELTA["a"], "b": np.zeros(4)}])
    assert np.array_equal(out["b"], START["b"]) and all(np.isfinite(v).all() for v in out.values())
    rule = ScaleFreeAdamRule()
    updates = [({"w": np.array([1.0, 2.0], np.float32)}, 1), ({"w": np.array([3.0, 2.0], np.float32)}, 3)]
    step = rule.aggregate({"w": np.zeros(2, np.float32)}, updates)["w"]
    avg = fedavg(updates)["w"].astype(np.float64)  # (2.5, 2): the rule's pseudo-gradient is FedAvg's average
    rms = np.sqrt(np.mean(avg ** 2))
    assert np.allclose(step, rms * avg / (avg + 10 * TAU_REL * rms), rtol=1e-5)


def test_buffers_survive_a_checkpoint_and_the_rule_is_the_default_tiff_variant():
    rule = ScaleFreeAdamRule()
    first = rounds(rule, START, [DELTA])[0]
    restored = ScaleFreeAdamRule()
    restored.load_state_dict(rule.state_dict())
    a, b = rounds(rule, first, [DELTA]), rounds(restored, first, [DELTA])
    assert all(np.array_equal(a[0][k], b[0][k]) for k in START)
    assert issubclass(STRATEGIES.get(DEFAULT_STRATEGY).rule, ScaleFreeAdamRule)  # the default is this rule, capped


def test_the_job_default_is_the_strategy_packages_default():
    from mlsyskit.tools.fl.config import JobConfig
    from mlsyskit.tools.fl.strategy import DEFAULT_STRATEGY, STRATEGIES

    assert JobConfig().strategy == DEFAULT_STRATEGY
    assert DEFAULT_STRATEGY in STRATEGIES.names()
