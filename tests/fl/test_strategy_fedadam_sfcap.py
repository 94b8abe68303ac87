"""Scale-free FedAdam capped by the server's own reference update (`fedadam-sfcap`, TIFF's default rule): the
clients' updates can lower the server's step but not raise it past the reference's; the strategy hands the rule
its reference per tensor."""
from __future__ import annotations

import numpy as np

from mlsyskit.tools.fl.incentive.verify import Reference
from mlsyskit.tools.fl.model import flatten
from mlsyskit.tools.fl.strategy import STRATEGIES
from mlsyskit.tools.fl.strategy.base import per_tensor
from mlsyskit.tools.fl.strategy.fedadam import TAU_REL_CAPPED, CappedScaleFreeAdamRule

START = {"a": np.zeros((3, 4), np.float32), "b": np.zeros(4, np.float32)}
RNG = np.random.default_rng(1)
DELTA = {"a": RNG.normal(0, 0.05, (3, 4)), "b": RNG.normal(0, 2.0, 4)}
REF = {"a": RNG.normal(0, 0.01, (3, 4)), "b": RNG.normal(0, 0.5, 4)}  # the server's own update: smaller


def rms(a) -> float:
    return float(np.sqrt(np.mean(np.square(a))))


def first_step(d, lr):
    """Server Adam's first step without bias correction: m = 0.1 d, sqrt(v) = 0.1 |d|, tau = TAU_REL_CAPPED lr."""
    return lr * 0.1 * d / (0.1 * np.abs(d) + TAU_REL_CAPPED * lr)


def one_round(delta, reference=REF):
    rule = CappedScaleFreeAdamRule()
    rule.see_reference(reference)
    return rule.aggregate(START, [({k: (START[k] + delta[k]).astype(np.float32) for k in START}, 1)])


def test_larger_updates_than_the_reference_move_the_model_by_the_references_rate_whatever_their_size():
    for scale in (1, 100):
        out = one_round({k: scale * d for k, d in DELTA.items()})
        for k, d in DELTA.items():
            assert rms(REF[k]) < rms(d)
            assert np.allclose(out[k], first_step(scale * d, rms(REF[k])), rtol=1e-4, atol=1e-9)
            assert np.all(np.abs(out[k]) <= rms(REF[k]) * (1 + 1e-6))


def test_smaller_updates_than_the_reference_keep_their_own_scale_free_rate():
    tiny = {k: 0.01 * d for k, d in DELTA.items()}
    out = one_round(tiny)
    for k, d in tiny.items():
        assert rms(d) < rms(REF[k])
        assert np.allclose(out[k], first_step(d, rms(d)), rtol=1e-4, atol=1e-12)


def test_without_a_reference_the_rate_is_the_scale_free_one():
    out = one_round(DELTA, None)
    assert all(np.allclose(out[k], first_step(d, rms(d)), rtol=1e-4) for k, d in DELTA.items())


def test_the_strategy_splits_its_reference_per_tensor_and_tiff_composes_with_the_rule():
    trained = {k: START[k] + REF[k].astype(np.float32) for k in START}
    reference = Reference(flatten(START), START, flatten(trained) - flatten(START), 1.0)
    split = per_tensor(reference)
    assert list(split) == list(START) and all(split[k].shape == START[k].shape for k in START)
    assert all(np.allclose(split[k], REF[k], atol=1e-6) for k in START)
    assert STRATEGIES.get("tiff+fedadam-sfcap").rule is CappedScaleFreeAdamRule
