"""Bound each update instead of refusing it for size: a scaled update is accepted, scaled down to the round's
bound and discounted in quality by the same factor; honest updates are never refused for size, on round 1
and at 10k clients (issue 21)."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from mlsyskit.core.storage import MetaStore
from mlsyskit.tools.fl.config import DataSpec, JobConfig
from mlsyskit.tools.fl.coordinator import Coordinator
from mlsyskit.tools.fl.data import load_client
from mlsyskit.tools.fl.incentive.verify import CLIP_RATIO, TYPICAL_CAP, size_factors
from mlsyskit.tools.fl.model import flatten
from mlsyskit.tools.fl.outcome import RoundOutcome
from mlsyskit.tools.fl.strategy.base import WEIGHT_POWER
from mlsyskit.tools.fl.threads import single_threaded
from mlsyskit.tools.fl.training import SCALE_FACTOR, train_local


def test_size_factors_known_answers():
    assert size_factors({}) == {}
    # the typical size is the lower quartile (1.0): bound 2.0, so 10 is scaled by 0.2 and the rest are kept
    assert size_factors({0: 1.0, 1: 1.0, 2: 1.5, 3: 10.0}) == {0: 1.0, 1: 1.0, 2: 1.0, 3: pytest.approx(0.2)}
    # half the round inflated 10x: the lower quartile is still honest, every inflated update is bounded
    honest, inflated = [0.8, 1.0, 1.2], [8.0, 10.0, 12.0]
    factors = size_factors(dict(enumerate(honest + inflated)))
    assert all(factors[i] == 1.0 for i in range(3)) and all(factors[i] < 0.3 for i in range(3, 6))
    # a round that attackers happen to fill is bounded by the previous rounds' sizes (the window)
    window = size_factors({0: 9.0, 1: 10.0, 2: 11.0, 3: 12.0}, earlier=[0.8, 1.0, 1.2, 1.0, 0.9, 1.1, 1.0, 0.9])
    assert all(f < 0.3 for f in window.values())
    assert size_factors({0: 9.0, 1: 10.0, 2: 11.0, 3: 12.0}) == {i: 1.0 for i in range(4)}  # this round alone: none
    # a first round of attackers only is still bounded by the server's own reference (the cap)
    capped = size_factors({0: 1000.0, 1: 1000.0})
    assert capped == {0: pytest.approx(CLIP_RATIO * TYPICAL_CAP / 1000.0), 1: pytest.approx(CLIP_RATIO * TYPICAL_CAP / 1000.0)}


def metrics(num_samples: int) -> dict[str, float]:
    return {"loss": 0.5, "quality": 0.5, "train_time_s": 0.1, "cpu_time_s": 0.1, "num_samples": num_samples}


def test_a_scaled_update_is_accepted_bounded_and_discounted_and_never_outweighs_an_honest_one():
    config = JobConfig(strategy="tiff", rounds=1, per_round=5, seed=3,
                       data=DataSpec(num_clients=5, alpha=0.5, seed=3))
    with MetaStore(":memory:") as store:
        c = Coordinator(config, store)
        for cid in range(5):
            c.register(cid, {"num_samples": c.partition_sizes[cid], "local_only_accuracy": 0.5})
        plan = c.begin_round(list(range(5)), now=0.0)
        deltas = {}
        for cid in plan.selected:
            data, features, classes = load_client(config.data, cid)
            attack = "scaled" if cid == plan.selected[0] else "none"
            result = train_local(plan.weights, data, config.train, features, classes, plan.seeds[cid], attack)
            accepted, reason = c.submit(cid, plan.round, result.weights, metrics(data.num_samples))
            assert accepted, reason  # the scaled update too: size alone refuses nothing
            deltas[cid] = np.linalg.norm(flatten(result.weights) - flatten(plan.weights))
        claimed = {cid: r.verified_quality for cid, r in c._reports.items()}
        # what the aggregation rule gets: every update bounded, weighing its samples x its factor
        probe = RoundOutcome(plan.round, plan.selected, {cid: replace(r) for cid, r in c._reports.items()})
        recent = list(c.strategy.verifier._recent)
        bounded = c.strategy.bound(dict(c._updates), probe)
        c.strategy.verifier._recent = recent  # the probe's round is not history: finish_round bounds it again
        outcome = c.finish_round(1.0)
    scaled = plan.selected[0]
    report = outcome.reports[scaled]
    assert report.status == "valid"
    # its honest training (the update / 10) would have had the honest updates' size: bounded, it is 10x smaller
    assert report.verified_quality < claimed[scaled] / (SCALE_FACTOR / (2 * CLIP_RATIO))
    assert not report.aggregated and report.verified_quality < min(outcome.reports[c].verified_quality
                                                                   for c in plan.selected[1:])
    assert all(outcome.reports[c].verified_quality == claimed[c] for c in plan.selected[1:])  # honest: unchanged
    assert deltas[scaled] > 3 * max(deltas[c] for c in plan.selected[1:])  # the attack was real
    factor = report.verified_quality / claimed[scaled]
    weights, weight = bounded[scaled]
    assert weight == pytest.approx(probe.reports[scaled].num_samples * factor ** WEIGHT_POWER)
    assert np.linalg.norm(flatten(weights) - flatten(plan.weights)) == pytest.approx(factor * deltas[scaled], rel=1e-4)
    for cid in plan.selected[1:]:  # honest updates pass unchanged, with their sample counts
        assert bounded[cid][1] == probe.reports[cid].num_samples


def test_honest_updates_are_never_refused_for_size_on_round_one_at_10k_clients():
    """The issue's repro: `fl-server simulate --dataset synthetic --clients 10000 --per-round 50` refused 24 of 50
    honest updates in round 1 as "N x the size of the server's reference"."""
    single_threaded()  # 50 tiny trainings: torch's thread pool costs more than it gives on a busy machine
    config = JobConfig(strategy="tiff", rounds=1, per_round=50, seed=0,
                       data=DataSpec(dataset="synthetic", num_clients=10_000, seed=0))
    with MetaStore(":memory:") as store:
        c = Coordinator(config, store)
        selected_pool = list(range(10_000))
        c.register_many({cid: {"num_samples": c.partition_sizes[cid], "local_only_accuracy": 0.5}
                         for cid in selected_pool})
        plan = c.begin_round(selected_pool, now=0.0)
        refused = []
        for cid in plan.selected:
            data, features, classes = load_client(config.data, cid)
            result = train_local(plan.weights, data, config.train, features, classes, plan.seeds[cid])
            accepted, reason = c.submit(cid, plan.round, result.weights, metrics(data.num_samples))
            if not accepted:
                refused.append(reason)
        outcome = c.finish_round(1.0)
    assert len(plan.selected) == 50 and not [r for r in refused if "size" in r], refused
    # round 1 starts from a random model: the floor (0.5 x the median alignment before chance) leaves some out
    assert sum(r.aggregated for r in outcome.reports.values()) >= 25
