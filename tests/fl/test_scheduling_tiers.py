"""Tiering by latency, re-tiering, deadlines, the accuracy trend, plateaus and the scheduling metrics."""
from __future__ import annotations

import json
import math
import random

import pytest

from mlsyskit.core.config import ConfigError
from mlsyskit.tools.fl.scheduling import metrics
from mlsyskit.tools.fl.scheduling.tiering import LatencyTiers, round_deadline
from mlsyskit.tools.fl.scheduling.trend import PlateauDetector, TierAccuracy, slope


def tiers_for(latencies, **kw):
    tiers = LatencyTiers(**kw)
    for cid, latency in enumerate(latencies):
        tiers.observe(cid, latency)
    tiers.maybe_retier(1)
    return tiers


def test_tiers_are_latency_quantiles_fastest_first():
    tiers = tiers_for([float(10 * (i + 1)) for i in range(20)], num_tiers=4)
    assert [tiers.tier_of(c) for c in range(20)] == [0] * 5 + [1] * 5 + [2] * 5 + [3] * 5
    assert tiers.members(3, range(20)) == [15, 16, 17, 18, 19]
    assert tiers.tier_of(99) is None  # never measured: no tier


def test_a_slowed_client_is_retiered_on_the_period():
    tiers = tiers_for([10.0] * 10 + [100.0] * 10, num_tiers=2, ema_beta=0.5, retier_every=5, drift_fraction=0.5)
    assert tiers.tier_of(0) == 0
    for round_num in range(2, 7):
        tiers.observe(0, 400.0)
        retiered = tiers.maybe_retier(round_num)
        assert retiered == (round_num == 6)  # one slow client is no drift: it waits for the period
    assert tiers.tier_of(0) == 1


def test_drift_retiers_before_the_period():
    tiers = tiers_for([10.0] * 10 + [100.0] * 10, num_tiers=2, ema_beta=1.0, retier_every=100)
    for cid in range(10, 20):
        tiers.observe(cid, 5.0)  # the slow half got fast: the distribution drifted
    assert tiers.maybe_retier(2)
    assert tiers.retiers == 2 and tiers.tier_of(15) == 0 and tiers.tier_of(3) == 1


def test_newly_profiled_clients_trigger_a_retier_and_state_round_trips():
    tiers = tiers_for([1.0, 2.0], num_tiers=2, drift_fraction=0.1)
    for cid in range(2, 10):
        tiers.observe(cid, float(cid))
    assert tiers.maybe_retier(2)
    copy = LatencyTiers(num_tiers=2)
    copy.load_state_dict(json.loads(json.dumps(tiers.state_dict())))
    assert copy.state_dict() == tiers.state_dict()


def test_round_deadline_uses_the_slowest_expected_selected_client():
    assert round_deadline([10.0, 20.0], 1.5, 600.0) == 30.0
    assert round_deadline([10.0, None], 1.5, 600.0) == 900.0
    assert round_deadline([], 2.0, 60.0) == 60.0
    # profiled_only: an explored client does not stretch the round to the fallback
    assert round_deadline([10.0, None], 1.5, 600.0, profiled_only=True) == 15.0
    assert round_deadline([None, None], 1.5, 600.0, profiled_only=True) == 600.0
    with pytest.raises(ConfigError):
        round_deadline([1.0], 0.5, 60.0)


def test_slope_and_tier_trend():
    assert slope([(1, 1.0), (2, 3.0), (3, 5.0)]) == pytest.approx(2.0)
    assert slope([(1, 1.0)]) == 0.0 and slope([(2, 1.0), (2, 3.0)]) == 0.0
    trend = TierAccuracy(window=3)
    for r, acc in enumerate([0.1, 0.2, 0.3, 0.3, 0.3], start=1):
        trend.record(r, 0, acc)
    assert trend.accuracy(0) == 0.3 and trend.slope(0) == pytest.approx(0.0)  # only the last 3 count
    assert trend.accuracy(1) is None


def test_plateau_detector():
    plateau = PlateauDetector(window=3, min_gain=0.01)
    for acc in [0.1, 0.3, 0.5, 0.6]:
        plateau.record(acc)
        assert not plateau.plateaued()
    for acc in [0.605, 0.6, 0.602]:
        plateau.record(acc)
    assert plateau.plateaued()
    plateau.record(0.7)
    assert not plateau.plateaued()


def test_jain_index():
    assert metrics.jain_index([1, 1, 1, 1]) == pytest.approx(1.0)
    assert metrics.jain_index([4, 0, 0, 0]) == pytest.approx(0.25)
    assert metrics.jain_index([1, 2, 3]) == pytest.approx(36 / 42)
    assert metrics.jain_index([0, 0]) == 1.0 and math.isnan(metrics.jain_index([]))
    with pytest.raises(ValueError):
        metrics.jain_index([1, -1])
    assert metrics.per_client(4, {1: 2.0}) == [0.0, 2.0, 0.0, 0.0]
    with pytest.raises(ValueError):
        metrics.per_client(2, {5: 1.0})


def test_time_to_accuracy_and_spread_and_work():
    assert metrics.time_to_accuracy([10, 25, 40], [0.5, 0.8, 0.9], 0.8) == 25
    assert metrics.time_to_accuracy([10, 25], [0.5, 0.6], 0.8) is None
    with pytest.raises(ValueError):
        metrics.time_to_accuracy([1], [0.1, 0.2], 0.1)
    spread = metrics.accuracy_spread([0.1 * i for i in range(1, 21)])
    assert spread["worst10_mean"] == pytest.approx(0.15) and spread["p10"] == pytest.approx(0.2)
    assert spread["std"] == pytest.approx(0.5766, abs=1e-3)
    totals = metrics.work_totals({1: 10.0, 2: 30.0}, {2: 10.0})
    assert totals == {"cpu_s": 40.0, "wasted_cpu_s": 10.0, "wasted_fraction": 0.25}


def test_signals_read_the_coordinators_deadline_failures():
    from mlsyskit.tools.fl.outcome import ClientReport, RoundOutcome
    from mlsyskit.tools.fl.scheduling.signals import signals

    reports = {1: ClientReport(1, {}, "failed", "no update before the deadline"),
               2: ClientReport(2, {}, "failed", "disconnected"),
               3: ClientReport(3, {"train_time_s": 2.0, "comm_time_s": 1.0, "cpu_time_s": 1.5, "num_samples": 7,
                                   "loss": 0.5, "quality": 0.8}),
               4: ClientReport(4, {"train_time_s": float("nan"), "accuracy": 3.0, "loss": -1.0})}
    by_id = {s.client_id: s for s in signals(RoundOutcome(1, [1, 2, 3, 4], reports, duration_s=30.0))}
    assert by_id[1].late and by_id[1].latency_s == 30.0  # never arrived: at least the round's length
    assert by_id[2].latency_s is None and not by_id[2].late
    assert by_id[3].latency_s == 3.0 and by_id[3].accuracy == 0.8 and by_id[3].loss_sq_mean == 0.25
    assert by_id[4].latency_s is None and by_id[4].accuracy is None and by_id[4].loss_sq_mean is None  # forged


def test_a_client_claiming_to_be_fast_is_tiered_by_the_servers_clock():
    from mlsyskit.tools.fl.outcome import ClientReport, RoundOutcome
    from mlsyskit.tools.fl.selectors import make_selector

    scheduler = make_selector("fast")
    for r in range(1, 4):
        reports = {c: ClientReport(c, {"train_time_s": 1.0 + c, "received_s": 1.0 + c, "num_samples": 5})
                   for c in range(10)}
        reports[9] = ClientReport(9, {"train_time_s": 0.01, "received_s": 40.0, "num_samples": 5})  # the liar
        scheduler.observe(RoundOutcome(r, list(range(10)), reports, {"accuracy": 0.5}))
    assert scheduler.tiers.expected_latency(9) == 40.0
    assert scheduler.tiers.tier_of(9) == scheduler.tracking.num_tiers - 1
    assert 9 not in scheduler.select(4, list(range(10)), 3, random.Random(0))
