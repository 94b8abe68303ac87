"""The virtual-clock harness: determinism, masking, deadlines and wasted work, re-tiering after a
slowdown, and the direction of the knobs on the synthetic learning-curve model (a model, not
training: these are direction checks, not the issue's benchmark targets)."""
from __future__ import annotations

import statistics

import pytest

from mlsyskit.tools.fl.scheduling.availability import SyntheticAvailability
from mlsyskit.tools.fl.scheduling.base import TrackingConfig
from mlsyskit.tools.fl.scheduling.harness import HarnessConfig, run
from mlsyskit.tools.fl.scheduling.hetero import HeteroConfig
from mlsyskit.tools.fl.scheduling.resources import ResourceModel, Slowdown
from mlsyskit.tools.fl.selectors import make_selector

SMALL = HarnessConfig(clients=60, per_round=6, rounds=40)
SEEDS = (0, 1, 2)


def summaries(name, config=SMALL):
    return [run(make_selector(name), config, seed).summary(target=0.7) for seed in SEEDS]


@pytest.mark.parametrize("name", ["oort", "adaptive", "tifl"])
def test_same_seed_same_trace_and_results(name):
    first = run(make_selector(name), SMALL, seed=4)
    second = run(make_selector(name), SMALL, seed=4)
    assert first.selections == second.selections
    assert first.accuracy == second.accuracy and first.round_end_s == second.round_end_s
    assert first.summary(0.7) == second.summary(0.7)
    assert run(make_selector(name), SMALL, seed=5).selections != first.selections


def test_fast_shortens_rounds_against_random_on_every_seed():
    for fast, rand in zip(summaries("fast"), summaries("random"), strict=True):
        assert fast["mean_round_s"] < 0.8 * rand["mean_round_s"]


def test_rfair_raises_participation_fairness():
    rfair, rand, fast = summaries("rfair"), summaries("random"), summaries("fast")
    for r, b in zip(rfair, rand, strict=True):
        assert r["participation_jain"] > b["participation_jain"]
        assert r["participation_jain"] >= 0.9
    assert statistics.mean(r["cpu_jain"] for r in rfair) > statistics.mean(f["cpu_jain"] for f in fast)


def test_afair_narrows_per_client_accuracy_against_fast():
    for a, f in zip(summaries("afair"), summaries("fast"), strict=True):
        assert a["client_accuracy_std"] < f["client_accuracy_std"]
        assert a["client_accuracy_worst10_mean"] > f["client_accuracy_worst10_mean"]


def test_unavailable_clients_are_masked():
    availability = SyntheticAvailability(3, mean_on_s=60, mean_off_s=60, horizon_s=50_000)
    for name in ("random", "oort", "adaptive"):
        result = run(make_selector(name), SMALL, seed=3, availability=availability)
        starts = [0.0, *result.round_end_s[:-1]]
        for start, chosen in zip(starts, result.selections, strict=True):
            assert all(availability.is_active(c, start) for c in chosen)
        assert result.wasted_cpu_s, "with 60 s sessions some clients go offline mid-round"


def test_a_tight_deadline_counts_wasted_work_and_caps_rounds():
    config = HarnessConfig(clients=60, per_round=6, rounds=15, deadline_s=3.0)
    result = run(make_selector("random"), config, seed=0)
    durations = [b - a for a, b in zip([0.0, *result.round_end_s], result.round_end_s, strict=False)]
    assert max(durations) <= 3.0 + 1e-9
    summary = result.summary()
    assert 0 < summary["wasted_cpu_s"] < summary["cpu_s"]
    loose = run(make_selector("random"), HarnessConfig(clients=60, per_round=6, rounds=15), seed=0).summary()
    assert loose["wasted_cpu_s"] == 0
    assert summary["final_accuracy"] < loose["final_accuracy"]  # late updates do not train the model


def test_a_client_slowed_mid_run_is_retiered_and_dropped_by_fast():
    def scheduler():
        return make_selector("fast", tracking=TrackingConfig(num_tiers=4, retier_every=5))

    baseline = scheduler()
    warm = run(baseline, HarnessConfig(clients=60, per_round=6, rounds=10), seed=0)
    quickest = min(baseline.tiers.ema, key=baseline.tiers.ema.get)
    assert baseline.tiers.tier_of(quickest) == 0 and any(quickest in chosen for chosen in warm.selections[-3:])
    slow_from = warm.round_end_s[-1]  # the first 10 rounds are the same in the run below
    resources = ResourceModel(seed=0, slowdowns=[Slowdown(quickest, slow_from, 50.0)])
    slowed = scheduler()
    result = run(slowed, HarnessConfig(clients=60, per_round=6, rounds=60), seed=0, resources=resources)
    assert result.selections[:10] == warm.selections
    # re-tiered out of the fast half: one slow round moves its EMA (beta 0.5) half way, and fast
    # stops picking it; only its exploration slot (1 of 6, drawn among all 60) may still land on it
    assert slowed.tiers.tier_of(quickest) >= 2 and slowed.tiers.retiers > baseline.tiers.retiers
    assert all(quickest in chosen for chosen in warm.selections[1:])  # before: in every round
    assert sum(quickest in chosen for chosen in result.selections[25:]) <= 2


def test_compare_reports_every_scheduler_with_values_in_range(capsys):
    from mlsyskit.tools.fl.scheduling.compare import COLUMNS, ORDER, main

    main(["20", "4", "8", "1"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2 + len(ORDER)
    for line, name in zip(lines[2:], ORDER, strict=True):
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[0] == name and len(cells) == 1 + len(COLUMNS)
        jain = float(cells[4])
        assert 0 < jain <= 1 and 0 <= float(cells[6]) <= 1


@pytest.mark.slow
def test_same_trace_in_processes_with_different_hash_seeds():
    import json
    import os
    import subprocess
    import sys

    script = ("import json\n"
              "from mlsyskit.tools.fl.selectors import make_selector\n"
              "from mlsyskit.tools.fl.scheduling.availability import SyntheticAvailability\n"
              "from mlsyskit.tools.fl.scheduling.harness import HarnessConfig, run\n"
              "out = {n: run(make_selector(n), HarnessConfig(clients=40, per_round=5, rounds=12), 7,\n"
              "              availability=SyntheticAvailability(7, mean_on_s=120, mean_off_s=60)).selections\n"
              "       for n in ('tifl', 'oort', 'adaptive')}\n"
              "print(json.dumps(out))\n")
    traces = []
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120,
                              check=True)
        traces.append(json.loads(done.stdout))
    assert traces[0] == traces[1]
    assert all(len(trace) == 12 for trace in traces[0].values())


def test_adaptive_leaves_fast_after_a_plateau_and_spreads_participation():
    for seed in SEEDS:
        adaptive = make_selector("adaptive")
        result = run(adaptive, SMALL, seed)
        # adaptive starts as fast with the utility-rate cut-off and deadlines from profiled clients (its presets)
        start = HeteroConfig(preset="fast", fast_cutoff="utility-rate")
        fast = run(make_selector("fast", start, TrackingConfig(deadline_profiled_only=True)), SMALL, seed)
        assert adaptive.shifts and adaptive.weights["fast"] < 1.0
        assert result.selections[:adaptive.shifts[0][0]] == fast.selections[:adaptive.shifts[0][0]]  # fast until then
        assert result.summary()["participation_jain"] > fast.summary()["participation_jain"]
