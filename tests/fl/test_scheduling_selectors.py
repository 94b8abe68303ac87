"""The schedulers as Selectors: TiFL, Oort and ours (fast, rfair, afair, perf, adaptive)."""
from __future__ import annotations

import json
import math
import random
from collections import Counter

import pytest

from mlsyskit.core.config import ConfigError
from mlsyskit.core.registry import UnknownNameError
from mlsyskit.tools.fl.outcome import ClientReport, RoundOutcome
from mlsyskit.tools.fl.scheduling.base import TrackingConfig
from mlsyskit.tools.fl.scheduling.hetero import HeteroConfig, HeteroScheduler
from mlsyskit.tools.fl.scheduling.oort import OortConfig, OortScheduler, weighted_sample
from mlsyskit.tools.fl.scheduling.tifl import TiflConfig, TiflScheduler
from mlsyskit.tools.fl.selectors import SELECTORS, make_selector

NAMES = ["random", "tifl", "oort", "fast", "rfair", "afair", "perf", "adaptive"]


def latency(cid):
    return 1.0 + cid  # client id = slowness


def accuracy_of(cid):
    return 0.9 - 0.005 * cid  # slow clients' data is learnt worst


def outcome(round_num, selected, global_accuracy=0.5, late=()):
    reports = {}
    for cid in selected:
        m = {"num_samples": 10 + cid, "loss": 1.0 + cid / 10, "train_time_s": latency(cid), "cpu_time_s": latency(cid),
             "accuracy": accuracy_of(cid), "quality": 0.5}
        reports[cid] = (ClientReport(cid, m, status="failed", reason="deadline 5.0s missed") if cid in late
                        else ClientReport(cid, m))
    return RoundOutcome(round_num, list(selected), reports, {"accuracy": global_accuracy, "deadline_s": 5.0})


def drive(scheduler, rounds, available=range(40), k=5, seed=0, accuracy=lambda r: min(0.9, 0.1 * r)):
    trace = []
    for r in range(1, rounds + 1):
        chosen = scheduler.select(r, list(available), k, random.Random(seed * 1000 + r))
        trace.append(chosen)
        scheduler.observe(outcome(r, chosen, accuracy(r)))
    return trace


def test_registry_names_and_unknown_name():
    # one family: TIFF's selectors and the schedulers, each registered once, each built the same way
    assert sorted(SELECTORS.names()) == sorted([*NAMES, "quality-greedy", "trusted-random"])
    for name in SELECTORS.names():
        assert make_selector(name).name == name
    with pytest.raises(UnknownNameError):
        make_selector("fastest")


@pytest.mark.parametrize("name", NAMES)
def test_selects_k_distinct_available_clients_deterministically(name):
    available = [3, 5, 8, 13, 21, 34, 35, 36, 37, 38, 39, 1, 2]
    trace_a = drive(make_selector(name), 30, available=available, k=4)
    trace_b = drive(make_selector(name), 30, available=available, k=4)
    assert trace_a == trace_b
    for chosen in trace_a:
        assert len(chosen) == 4 == len(set(chosen)) and set(chosen) <= set(available)
    small = make_selector(name).select(1, [7, 9], 5, random.Random(0))
    assert sorted(small) == [7, 9]  # fewer available than k: all of them


@pytest.mark.parametrize("name", [n for n in NAMES if n != "random"])
def test_state_dict_round_trips_through_json_and_resumes_the_same_selection(name):
    first = make_selector(name)
    drive(first, 25)
    second = make_selector(name)
    second.load_state_dict(json.loads(json.dumps(first.state_dict())))
    assert second.state_dict() == json.loads(json.dumps(first.state_dict()))
    rng_a, rng_b = random.Random(99), random.Random(99)
    assert first.select(26, list(range(40)), 5, rng_a) == second.select(26, list(range(40)), 5, rng_b)


@pytest.mark.parametrize("name", [n for n in NAMES if n != "random"])
def test_unavailable_clients_are_never_selected(name):
    scheduler = make_selector(name)
    drive(scheduler, 15)  # every client known and profiled
    for r in range(16, 30):
        online = [c for c in range(40) if (c + r) % 3]
        chosen = scheduler.select(r, online, 5, random.Random(r))
        assert set(chosen) <= set(online)
        scheduler.observe(outcome(r, chosen))


def test_tifl_chooses_one_tier_and_favours_the_lowest_accuracy_tier():
    scheduler = TiflScheduler(TiflConfig(interval=2), TrackingConfig(num_tiers=4))
    drive(scheduler, 40, k=5)
    assert scheduler.probs[3] == max(scheduler.probs) and scheduler.probs[0] == min(scheduler.probs)
    assert scheduler.probs == pytest.approx([0.1, 0.2, 0.3, 0.4])
    chosen = scheduler.select(41, list(range(40)), 5, random.Random(1))
    assert len({scheduler.tiers.tier_of(c) for c in chosen}) == 1  # each tier has 10 >= k members
    counts = Counter(scheduler.chosen_tiers[-30:])
    assert counts[3] > counts[0]


def test_tifl_credits_run_out():
    scheduler = TiflScheduler(TiflConfig(interval=1, credits=2), TrackingConfig(num_tiers=4))
    drive(scheduler, 30, k=5)
    counted = Counter(scheduler.chosen_tiers[:8])
    assert all(counted[t] == 2 for t in range(4))  # every tier exactly its 2 credits, then uniform
    assert scheduler.credits == [0, 0, 0, 0]


def test_oort_exploration_schedule_and_utility():
    scheduler = OortScheduler()
    assert scheduler.exploration(1) == pytest.approx(0.9)
    assert scheduler.exploration(11) == pytest.approx(0.9 * 0.98 ** 10)
    assert scheduler.exploration(500) == pytest.approx(0.3)
    scheduler.observe(outcome(1, [0, 4]))
    # statistical utility |B| * sqrt(mean loss^2): loss^2 stands for the mean square when not reported
    assert scheduler.stat_utility[0] == pytest.approx(10 * 1.0) and scheduler.stat_utility[4] == pytest.approx(14 * 1.4)
    utility = scheduler.utilities(3, [0, 4])
    preferred = scheduler.preferred_duration()
    assert preferred == pytest.approx(1.0)  # the 30th percentile of {1, 5}
    bonus = math.sqrt(0.1 * math.log(3) / 1)
    assert utility[0] == pytest.approx(10 / 19.6 + bonus)  # the 95th percentile of two is the larger
    assert utility[4] == pytest.approx((1 + bonus) * (1.0 / 5.0) ** 2)  # slower than preferred: penalised
    with pytest.raises(ConfigError):
        OortConfig(explore_start=0.2, explore_min=0.3)


def test_oort_late_clients_carry_no_statistical_utility_and_pacer_relaxes():
    scheduler = OortScheduler(OortConfig(pacer_window=2, pacer_step=10, pacer_rule="falling"))
    scheduler.observe(outcome(1, [1, 2], late={2}))
    assert scheduler.stat_utility[2] == 0.0 and scheduler.tiers.expected_latency(2) == 5.0  # at least the deadline
    for r, chosen in zip(range(2, 5), [[1, 2, 3], [1], [1]], strict=True):
        scheduler.observe(outcome(r, chosen))
    assert scheduler.threshold == 40.0  # utility fell over the last window: preferred duration relaxed


def test_weighted_sample_is_proportional():
    counts = Counter()
    rng = random.Random(0)
    for _ in range(4000):
        counts.update(weighted_sample([1, 2, 3], [1.0, 1.0, 8.0], 1, rng))
    assert counts[3] / 4000 == pytest.approx(0.8, abs=0.03)


def test_fast_prefers_the_fastest_clients_and_rfair_rotates():
    # fast_pool 0: the same fastest clients every round (4 of 5 slots by score; explore 0.1 x 5 rounds up to 1)
    narrow = drive(HeteroScheduler(HeteroConfig(preset="fast", fast_pool=0.0)), 30, k=5)
    late = Counter(c for chosen in narrow[-10:] for c in chosen)
    assert sum(n for c, n in late.items() if c < 10) >= 4 * 10
    assert sorted(late.most_common(4)) == [(0, 10), (1, 10), (2, 10), (3, 10)]
    # a pool (3 x k fastest profiled clients tie): still fast clients, rotated for coverage
    pooled = drive(HeteroScheduler(HeteroConfig(preset="fast", fast_pool=3.0)), 30, k=5)
    late = Counter(c for chosen in pooled[-10:] for c in chosen)
    assert sum(n for c, n in late.items() if c < 25) >= 4 * 10  # the fast 60% of a population of 40
    assert max(late.values()) <= 6 and len(late) >= 15
    rfair = make_selector("rfair")
    drive(rfair, 40, k=5)  # 200 slots over 40 clients
    assert set(rfair.participation.values()) <= {4, 5, 6}
    assert rfair.participation_jain() > 0.98


def test_afair_favours_the_worst_accuracy_tier():
    afair = HeteroScheduler(HeteroConfig(preset="afair", explore=0.0, afair_client_share=0.0, fast_pool=0.0))
    drive(afair, 20, k=5)  # the tier term alone (the client term: test_scheduling_afair.py)
    accuracies = afair.tier_accuracies()
    worst = min(accuracies, key=accuracies.get)
    members = afair.tiers.members(worst, range(40))
    assert 1 <= len(members) <= 5
    chosen = afair.select(21, list(range(40)), 5, random.Random(0))
    assert set(members) <= set(chosen)  # every member of the worst tier, the rest from the next worst
    second = sorted(accuracies, key=accuracies.get)[1]
    assert all(afair.tiers.tier_of(c) in (worst, second) for c in chosen)


def test_perf_favours_the_tier_whose_rounds_raised_accuracy():
    perf = HeteroScheduler(HeteroConfig(preset="perf", explore=0.0, fast_pool=0.0))
    drive(perf, 10, k=5)  # profile everyone
    gains = iter(range(11, 100))
    for r in range(11, 41):
        chosen = perf.select(r, list(range(40)), 5, random.Random(r))
        # rounds with tier-4 clients raise the accuracy; the others lower it
        helpful = sum(perf.tiers.tier_of(c) == 4 for c in chosen)
        perf.observe(outcome(r, chosen, 0.5 + 0.01 * helpful * next(gains) / 100))
    assert max(perf.tier_gain, key=perf.tier_gain.get) == 4


def test_free_weights_override_presets_and_are_validated():
    scheduler = HeteroScheduler(HeteroConfig(preset="fast", weights={"rfair": 3.0, "fast": 1.0}))
    assert scheduler.weights == {"fast": 0.25, "rfair": 0.75, "afair": 0.0, "perf": 0.0, "util": 0.0}
    assert not scheduler.adaptive
    with pytest.raises(ConfigError):
        HeteroConfig(weights={"speed": 1.0})
    with pytest.raises(ConfigError):
        HeteroConfig(weights={"fast": -1.0})
    with pytest.raises(ConfigError):
        HeteroConfig(preset="slow")
    with pytest.raises(ConfigError):
        HeteroConfig(weights={"fast": 0.0}).initial_weights()


def test_adaptive_starts_fast_and_shifts_on_plateau():
    adaptive = make_selector("adaptive")
    assert adaptive.weights["fast"] == 1.0
    drive(adaptive, 8, accuracy=lambda r: 0.1 * r)  # still improving: no shift
    assert adaptive.shifts == [] and adaptive.weights["fast"] == 1.0
    drive_from = 9
    for r in range(drive_from, drive_from + 20):
        chosen = adaptive.select(r, list(range(40)), 5, random.Random(r))
        adaptive.observe(outcome(r, chosen, 0.8))  # flat
    assert adaptive.shifts, "a plateau must move weight off fast"
    assert adaptive.weights["fast"] < 1.0
    assert sum(adaptive.weights.values()) == pytest.approx(1.0)
    assert adaptive.shifts[0][1] == "rfair"  # fast concentrated participation below the Jain target
    rounds = [r for r, _ in adaptive.shifts]
    assert all(b - a >= adaptive.tracking.plateau_window for a, b in zip(rounds, rounds[1:], strict=False))


@pytest.mark.parametrize("name", ["tifl", "oort", "adaptive"])
def test_memory_grows_with_clients_touched_not_with_the_population(name):
    scheduler = make_selector(name)
    population = list(range(100_000))
    touched = set()
    for r in range(1, 4):
        chosen = scheduler.select(r, population, 10, random.Random(r))
        touched.update(chosen)
        scheduler.observe(outcome(r, chosen))
    state = scheduler.state_dict()
    for key in ("participation", "cpu_s", "accuracy"):
        assert set(map(int, state[key])) <= touched
    assert set(map(int, state["tiers"]["ema"])) <= touched
    assert len(touched) <= 30


def test_temperature_softens_the_top_k():
    strict = HeteroScheduler(HeteroConfig(preset="fast"))
    soft = HeteroScheduler(HeteroConfig(preset="fast", temperature=0.3))
    drive(strict, 30, k=5)
    soft_trace = drive(soft, 30, k=5)
    assert soft.participation_jain() > strict.participation_jain()
    for chosen in soft_trace:
        assert len(chosen) == 5 == len(set(chosen)) and set(chosen) <= set(range(40))
    slow_share = sum(c >= 20 for chosen in soft_trace[-10:] for c in chosen) / 50
    assert slow_share < 0.5  # still favours the fast half
    assert drive(HeteroScheduler(HeteroConfig(preset="fast", temperature=0.3)), 30, k=5) == soft_trace
    with pytest.raises(ConfigError):
        HeteroConfig(temperature=-1.0)


def test_oort_clips_a_forged_loss():
    scheduler = OortScheduler()
    chosen_liar = 0
    for r in range(1, 41):
        chosen = scheduler.select(r, list(range(40)), 5, random.Random(r))
        out = outcome(r, chosen)
        if 7 in out.reports:
            out.reports[7].metrics["loss_sq_mean"] = 1e12  # claims a huge loss to look useful
            chosen_liar += 1
        scheduler.observe(out)
    assert chosen_liar >= 1
    explored = sorted(scheduler.stat_utility)
    lying = scheduler.utilities(41, explored)[7]
    scheduler.stat_utility[7] = max(u for c, u in scheduler.stat_utility.items() if c != 7)
    assert lying == pytest.approx(scheduler.utilities(41, explored)[7])  # no more than the best honest claim


def test_scheduler_configs_load_from_toml_with_unknown_keys_refused(tmp_path):
    from mlsyskit.core.config import load_config

    path = tmp_path / "sched.toml"
    path.write_text('[hetero]\npreset = "perf"\nweights = { fast = 1, afair = 3 }\n\n'
                    '[oort]\nexplore_min = 0.2\n\n[tracking]\nnum_tiers = 3\n')
    hetero = load_config(HeteroConfig, path, section="hetero")
    assert HeteroScheduler(hetero).weights == {"fast": 0.25, "rfair": 0.0, "afair": 0.75, "perf": 0.0, "util": 0.0}
    assert load_config(OortConfig, path, section="oort").explore_min == 0.2
    assert load_config(TrackingConfig, path, section="tracking", overrides={"retier_every": 4}).retier_every == 4
    path.write_text('[hetero]\nweigths = { fast = 1 }\n')
    with pytest.raises(ConfigError, match="weigths"):
        load_config(HeteroConfig, path, section="hetero")
    with pytest.raises(ConfigError):
        load_config(TiflConfig, None, overrides={"interval": 0})
