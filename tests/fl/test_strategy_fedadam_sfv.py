"""Scale-free FedAdam whose rate the server picks on its validation split (`fedadam-sfv`): of the two capped
scale-free steps (this round's rate, the drift's) it keeps the model that scores higher, the drift's on a tie,
and is fedadam-sfcap without a validation split; TIFF hands the rule its split's accuracy."""
from __future__ import annotations

import numpy as np

from mlsyskit.tools.fl.config import JobConfig
from mlsyskit.tools.fl.strategy import STRATEGIES
from mlsyskit.tools.fl.strategy.base import Validation
from mlsyskit.tools.fl.strategy.fedadam import (
    CappedScaleFreeAdamRule,
    DriftRateAdamRule,
    ValidatedRateAdamRule,
)
from mlsyskit.tools.fl.task import ClientData

START = {"a": np.zeros((3, 4), np.float32), "b": np.zeros(4, np.float32)}
RNG = np.random.default_rng(3)
DELTA = {"a": RNG.normal(0, 0.05, (3, 4)), "b": RNG.normal(0, 2.0, 4)}
SWING = [DELTA, {k: -d for k, d in DELTA.items()}]  # the drift's rate is far below this round's in round 2
BIG_REF = {k: 100 * d for k, d in DELTA.items()}


def last_model(rule, deltas=SWING):
    rule.see_reference(BIG_REF)
    weights = START
    for delta in deltas:
        weights = rule.aggregate(weights, [({k: (weights[k] + delta[k]).astype(np.float32) for k in START}, 1)])
    return weights


def size(weights) -> float:
    return float(sum(np.square(weights[k].astype(np.float64)).sum() for k in weights))


def scored(score):
    rule = ValidatedRateAdamRule()
    rule.see_validation(score)
    return last_model(rule)


def same(a, b) -> bool:
    return all(np.array_equal(a[k], b[k]) for k in START)


def test_it_keeps_the_candidate_that_scores_higher_on_the_validation_split():
    drift, this_round = last_model(DriftRateAdamRule()), last_model(CappedScaleFreeAdamRule())
    assert not same(drift, this_round)
    # round 1's candidates coincide (the drift is the pseudo-gradient); round 2 decides
    assert same(scored(lambda w: -abs(size(w) - size(drift))), drift)
    assert same(scored(lambda w: -abs(size(w) - size(this_round))), this_round)


def test_a_tie_keeps_the_drifts_smaller_step_and_no_validation_is_fedadam_sfcap():
    assert same(scored(lambda w: 0.5), last_model(DriftRateAdamRule()))
    assert same(last_model(ValidatedRateAdamRule()), last_model(CappedScaleFreeAdamRule()))


def test_tiff_hands_the_rule_its_validation_accuracy():
    x = RNG.normal(size=(8, 4)).astype(np.float32)
    data = ClientData(-1, x, np.arange(8) % 2, x[:0], np.zeros(0, np.int64))
    validation = Validation(data, 4, 2, accuracy=lambda w: 0.25)
    strategy = STRATEGIES.get("tiff+fedadam-sfv")(JobConfig(), lambda w: {}, validation)
    assert isinstance(strategy.aggregator, ValidatedRateAdamRule)
    assert strategy.aggregator.score is validation.accuracy
