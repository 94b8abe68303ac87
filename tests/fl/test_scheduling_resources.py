"""Client heterogeneity for scheduling: lazy FLASH profiles, slowdowns, FedScale-schema availability."""
from __future__ import annotations

import json
import os
import pickle
import random
import statistics
import time

import pytest

from mlsyskit.core.config import ConfigError
from mlsyskit.tools.fl.scheduling.availability import (
    OnOffTrace,
    SyntheticAvailability,
    TraceAvailability,
    load_trace,
    parse_trace,
)
from mlsyskit.tools.fl.scheduling.resources import ResourceModel, Slowdown, flash_tables


def test_profiles_are_lazy_and_deterministic_per_client():
    start = time.process_time()
    model = ResourceModel(seed=3)
    far = model.profile(99_999)  # no other client exists for this
    assert time.process_time() - start < 1.0  # nothing is built for the 99,999 others
    assert ResourceModel(seed=3).profile(99_999) == far
    assert model.profile(5) == ResourceModel(seed=3).profile(5)
    assert ResourceModel(seed=4).profile(5) != model.profile(5)
    assert len({model.profile(c).compute_rate for c in range(50)}) > 10


def test_profiles_follow_the_flash_distributions():
    model = ResourceModel(seed=0, median_rate=200.0)
    rates = [model.profile(c).compute_rate for c in range(3000)]
    assert 150 < statistics.median(rates) < 260  # the median phone computes at median_rate
    scores, links = flash_tables()
    assert max(rates) / min(rates) == pytest.approx(scores[-1] / scores[0], rel=0.3)
    downs = {model.profile(c).down_kbps for c in range(3000)}
    assert downs <= {float(link["down_u"]) for link in links}
    assert len(downs) >= 15  # nearly all 19 measured links are used


def test_explicit_slowdown_changes_compute_time_from_its_start():
    model = ResourceModel(seed=1, slowdowns=[Slowdown(7, 300.0, 4.0), Slowdown(7, 900.0, 1.0)])
    def compute(t):
        return model.round_cost(7, t, 100, 1, 1000, random.Random(0))[0]
    assert compute(299.0) == pytest.approx(compute(0.0))
    assert compute(300.0) == pytest.approx(4 * compute(0.0))
    assert compute(900.0) == pytest.approx(compute(0.0))  # a later event ends the episode
    assert model.slowdown_factor(8, 500.0) == 1.0


def test_random_slowdowns_hit_the_configured_fraction():
    model = ResourceModel(seed=2, random_slowdown_fraction=0.3, horizon_s=1000.0)
    slowed = [c for c in range(2000) if model.slowdown_factor(c, 1000.0) > 1]
    assert 0.25 < len(slowed) / 2000 < 0.35
    early = sum(model.slowdown_factor(c, 10.0) > 1 for c in range(2000))
    assert early < len(slowed) / 10  # episodes start during the run, not before it
    assert all(2.0 <= model.slowdown_factor(c, 1000.0) <= 5.0 for c in slowed)


def test_bad_resource_settings_are_rejected():
    with pytest.raises(ConfigError):
        Slowdown(1, 0.0, 0.0)
    with pytest.raises(ConfigError):
        ResourceModel(0, random_slowdown_fraction=1.5)


def test_trace_follows_fedscale_semantics_with_wraparound():
    trace = OnOffTrace((0.0, 100.0), (50.0, 150.0), 200.0)
    assert trace.is_active(0) and trace.is_active(50) and not trace.is_active(75)
    assert trace.is_active(120) and not trace.is_active(180)
    assert trace.is_active(220) and not trace.is_active(260)  # the pattern repeats every finish_time
    assert trace.online_until(110) == 150 and trace.online_until(75) == 75


@pytest.mark.parametrize("active,inactive,finish", [((0, 40), (50, 60), 100), ((10,), (5,), 100),
                                                    ((0,), (50, 60), 100), ((0,), (150,), 100), ((), (), 10)])
def test_malformed_traces_are_rejected(active, inactive, finish):
    with pytest.raises(ConfigError):
        OnOffTrace(tuple(map(float, active)), tuple(map(float, inactive)), float(finish))


def test_trace_availability_maps_clients_modulo_the_trace(tmp_path):
    raw = {"a": {"active": [0, 100], "inactive": [50, 150], "finish_time": 200, "duration": 200},
           "b": {"active": [60], "inactive": [90], "finish_time": 100}}
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(raw))
    availability = load_trace(path)
    assert availability.is_active(0, 10) and not availability.is_active(1, 10)
    assert availability.is_active(3, 70) and not availability.is_active(2, 70)  # 3 -> b, 2 -> a


def test_fedscale_pickle_loads_as_data_and_a_forged_one_runs_nothing(tmp_path):
    good = tmp_path / "client_behave_trace"
    good.write_bytes(pickle.dumps({1: {"active": [0.0], "inactive": [10.0], "finish_time": 20.0}}))
    assert load_trace(good).is_active(0, 5)
    marker = tmp_path / "pwned"

    class Exploit:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    evil = tmp_path / "evil"
    evil.write_bytes(pickle.dumps({1: Exploit()}))
    with pytest.raises(ConfigError, match="only dicts"):
        load_trace(evil)
    assert not marker.exists()
    garbage = tmp_path / "garbage"
    garbage.write_bytes(b"\x00\x01not a trace")
    with pytest.raises(ConfigError):
        load_trace(garbage)
    with pytest.raises(ConfigError, match="entry"):
        parse_trace({"x": {"active": [0]}})
    with pytest.raises(ConfigError):
        TraceAvailability(parse_trace([]))


def test_synthetic_availability_is_seeded_per_client_with_the_expected_duty_cycle():
    a = SyntheticAvailability(5, mean_on_s=300, mean_off_s=100, horizon_s=20_000)
    b = SyntheticAvailability(5, mean_on_s=300, mean_off_s=100, horizon_s=20_000)
    assert a.trace(77) == b.trace(77) and a.trace(77) != a.trace(78)
    online = [a.is_active(c, t) for c in range(200) for t in range(0, 20_000, 997)]
    assert 0.68 < sum(online) / len(online) < 0.82  # 300 / (300 + 100) = 0.75
    always = SyntheticAvailability(5, always_on_fraction=1.0)
    assert all(always.is_active(c, t) for c in range(20) for t in (0, 5000, 80_000))


def test_simulated_clients_report_the_fields_real_clients_measure():
    from mlsyskit.tools.fl.aggregation import METRIC_KEYS

    model = ResourceModel(seed=0, slowdowns=[Slowdown(2, 100.0, 3.0)])
    before = model.measured(2, 0.0, 50, 2, 100_000, random.Random(1))
    after = model.measured(2, 100.0, 50, 2, 100_000, random.Random(1))
    assert {"train_time_s", "cpu_time_s"} <= set(METRIC_KEYS) and {"train_time_s", "cpu_time_s"} <= set(before)
    assert after["train_time_s"] == pytest.approx(3 * before["train_time_s"])
    assert after["comm_time_s"] == pytest.approx(before["comm_time_s"])  # a slowdown is compute only
    assert before["cpu_time_s"] == before["train_time_s"] and before["comm_time_s"] > 0
