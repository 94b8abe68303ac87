"""The robust aggregation rules on small arrays with known answers, and what a Byzantine update can do to each."""
from __future__ import annotations

import numpy as np
import pytest

from mlsyskit.core.storage import MetaStore
from mlsyskit.tools.fl.aggregation import Aggregator, fedavg
from mlsyskit.tools.fl.config import DataSpec, JobConfig
from mlsyskit.tools.fl.coordinator import Coordinator
from mlsyskit.tools.fl.simulator import Simulation
from mlsyskit.tools.fl.strategy import ROBUST, STRATEGIES
from mlsyskit.tools.fl.strategy.fedadam import SERVER_LR as ADAM_LR
from mlsyskit.tools.fl.strategy.fedadam import FedAdamRule
from mlsyskit.tools.fl.strategy.fedavgm import MOMENTUM, SERVER_LR, FedAvgMRule
from mlsyskit.tools.fl.strategy.krum import KrumRule, krum_scores, multi_krum
from mlsyskit.tools.fl.strategy.median import MedianRule
from mlsyskit.tools.fl.strategy.trimmed_mean import TrimmedMeanRule, trimmed_mean


def w(*values: float, n: int = 1) -> tuple[dict[str, np.ndarray], int]:
    return {"w": np.array(values, np.float32)}, n


def test_median_known_answer_and_a_huge_update_moves_it_by_one_rank_at_most():
    updates = [w(1, 10), w(2, 20), w(3, 30), w(4, 40), w(5, 50)]
    assert MedianRule().aggregate({}, updates)["w"].tolist() == [3, 30]
    assert MedianRule().aggregate({}, updates[:4])["w"].tolist() == [2.5, 25]  # even count: mean of the middle two
    byzantine = updates[:3] + [w(1e9, -1e9), w(1e9, -1e9)]  # two of five
    out = MedianRule().aggregate({}, byzantine)["w"]
    assert 1 <= out[0] <= 3 and 10 <= out[1] <= 30 and out.dtype == np.float32  # between honest values


def test_trimmed_mean_known_answer_and_bounded_by_honest_values():
    values = np.array([[1.0], [2.0], [3.0], [4.0], [100.0]])
    assert trimmed_mean(values, 0.2)[0] == pytest.approx(3.0)  # drops 1 and 100
    assert trimmed_mean(values, 0.0)[0] == pytest.approx(22.0)  # the plain mean
    assert trimmed_mean(values, 0.5)[0] == pytest.approx(3.0)  # never drops everything: the median remains
    honest = [w(1.0), w(2.0), w(3.0), w(4.0)]
    out = TrimmedMeanRule().aggregate({}, honest + [w(-1e12)])["w"][0]
    assert 1.0 <= out <= 4.0  # one attacker of five is trimmed whatever it sends
    plain = fedavg(honest + [w(-1e12)])["w"][0]
    assert plain < -1e10  # what FedAvg does with it


def test_krum_scores_known_answer_and_multi_krum_leaves_the_outliers_out():
    points = np.array([[0.0], [1.0], [2.0], [10.0]])
    # n=4, f=0: 2 neighbours each; 0: 1+4, 1: 1+1, 2: 1+4, 10: 64+81
    assert krum_scores(points, 0).tolist() == [5.0, 2.0, 5.0, 145.0]
    honest = [w(1.0, 1.0), w(1.1, 0.9), w(0.9, 1.1), w(1.05, 1.0), w(0.95, 1.0)]
    attackers = [w(50.0, -50.0), w(-40.0, 60.0)]
    kept = multi_krum(honest + attackers)  # n=7: f=2, keeps 5
    assert sorted(kept) == [0, 1, 2, 3, 4]
    out = KrumRule().aggregate({}, honest + attackers)["w"]
    assert np.allclose(out, [1.0, 1.0], atol=0.06)
    assert multi_krum([w(1.0), w(5.0)]) == [0, 1]  # two updates: nothing to compare, both kept


def test_fedavgm_is_fedavg_plus_server_momentum_and_survives_a_checkpoint():
    start = {"w": np.zeros(2, np.float32)}
    rule = FedAvgMRule()
    first = rule.aggregate(start, [w(1.0, 2.0, n=1), w(3.0, 2.0, n=3)])  # avg (2.5, 2), delta = avg
    assert np.allclose(first["w"], SERVER_LR * np.array([2.5, 2.0]))
    restored = FedAvgMRule()
    restored.load_state_dict(rule.state_dict())
    for r in (rule, restored):  # the same second step from the checkpointed momentum
        second = r.aggregate(first, [w(*first["w"].tolist())])  # no change asked: momentum alone moves it
        assert np.allclose(second["w"], first["w"] + SERVER_LR * MOMENTUM * SERVER_LR * np.array([2.5, 2.0]))


def test_fedadam_moves_each_coordinate_by_about_the_server_lr_whatever_the_update_size():
    start = {"w": np.zeros(2, np.float32)}
    small = FedAdamRule().aggregate(start, [w(0.01, -0.01)])["w"]
    huge = FedAdamRule().aggregate(start, [w(1e6, -1e6)])["w"]
    # first step: m = 0.1 d, v = 0.01 d^2, so the move is lr * 0.1 d / (0.1 |d| + tau): ~lr, never more
    assert np.all(np.abs(huge) <= ADAM_LR + 1e-9) and np.allclose(np.abs(huge), ADAM_LR, rtol=1e-6)
    assert np.all(np.abs(small) < ADAM_LR) and np.sign(small).tolist() == [1.0, -1.0]
    rule = FedAdamRule()
    rule.aggregate(start, [w(1.0, 1.0)])
    again = FedAdamRule()
    again.load_state_dict(rule.state_dict())
    assert again.steps == 1 and np.allclose(again.state["m"]["w"], rule.state["m"]["w"])


@pytest.mark.parametrize("rule", [s.rule for s in ROBUST] + [Aggregator])
def test_every_rule_keeps_names_shapes_dtypes_and_refuses_nothing_to_aggregate(rule):
    start = {"a": np.zeros((2, 3), np.float32), "b": np.zeros(3, np.float32)}
    rng = np.random.default_rng(0)
    updates = [({k: (v + rng.normal(size=v.shape)).astype(np.float32) for k, v in start.items()}, 5 + i)
               for i in range(5)]
    out = rule().aggregate(start, updates)
    assert {k: (v.shape, v.dtype) for k, v in out.items()} == {k: (v.shape, v.dtype) for k, v in start.items()}
    assert all(np.isfinite(v).all() for v in out.values())
    with pytest.raises((ValueError, IndexError)):
        rule().aggregate(start, [])


def test_every_robust_rule_is_registered_alone_and_composed_with_tiff():
    names = STRATEGIES.names()
    for strategy in ROBUST:
        assert strategy.name in names and f"tiff+{strategy.rule.name}" in names
        composed = STRATEGIES.get(f"tiff+{strategy.rule.name}")
        assert composed.rule is strategy.rule and issubclass(composed, STRATEGIES.get("tiff"))
    assert {"fedavg", "tiff"} <= set(names)


@pytest.mark.parametrize("strategy", ["fedavgm", "tiff+fedadam"])
def test_a_server_optimisers_state_is_checkpointed_with_the_round_and_restored(tmp_path, strategy):
    config = JobConfig(strategy=strategy, rounds=2, per_round=3, seed=1, data=DataSpec(num_clients=4, seed=1))
    with MetaStore(tmp_path / "run.db") as store:
        sim = Simulation(config, store)
        sim.run()
        kept = sim.coordinator.strategy.aggregator
        assert kept.steps >= 1 and kept.state[kept.buffers[0]]
    with MetaStore(tmp_path / "run.db") as store:
        restored = Coordinator(config, store).strategy.aggregator
    assert restored.steps == kept.steps
    for buffer in kept.buffers:
        assert set(restored.state[buffer]) == set(kept.state[buffer])
        assert all(np.array_equal(restored.state[buffer][k], v) for k, v in kept.state[buffer].items())
