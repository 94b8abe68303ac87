"""Schedulers wired into the simulator: deadlines and wasted work on the virtual clock, measured fields in
the reports, availability masking, a slowdown mid-run re-tiers a client, TIFF's trust gates the scheduler,
the same seed gives the same trace twice, and a changed scheduler is refused on resume."""
from __future__ import annotations

import statistics

import pytest

from mlsyskit.core.storage import MetaStore
from mlsyskit.tools.fl.config import DataSpec, JobConfig, TrainSpec
from mlsyskit.tools.fl.coordinator import JobMismatch
from mlsyskit.tools.fl.scheduling.gated import GatedScheduler
from mlsyskit.tools.fl.scheduling.hetero import HeteroConfig
from mlsyskit.tools.fl.scheduling.resources import Slowdown
from mlsyskit.tools.fl.sim_world import WorldConfig
from mlsyskit.tools.fl.simulator import Simulation, SimulationOptions

FAST_TRAIN = TrainSpec(epochs=1, hidden=16, local_only_epochs=2)


def job(clients=40, per_round=4, rounds=6, strategy="fedavg", seed=0, timeout=600.0) -> JobConfig:
    return JobConfig(strategy=strategy, rounds=rounds, per_round=per_round, seed=seed, round_timeout_s=timeout,
                     train=FAST_TRAIN, data=DataSpec(dataset="synthetic", num_clients=clients, seed=seed,
                                                     synthetic_alpha=0.5, synthetic_beta=0.5))


def simulate(config: JobConfig, store=None, attacks=None, **options) -> Simulation:
    sim = Simulation(config, store or MetaStore(":memory:"), attacks,
                     options=SimulationOptions(eval_clients=10, **options))
    sim.run()
    return sim


def latencies(sim: Simulation) -> list[float]:
    return [r.metrics["received_s"] for o in sim.result.outcomes for r in o.with_status("valid")]


def test_reports_carry_measured_times_and_fast_picks_faster_clients_than_random():
    # explore 0: one explored slot in 4 would be a random client; this checks the choice by score
    fast = simulate(job(rounds=8), scheduler="fast", scheduler_config=HeteroConfig(preset="fast", explore=0.0))
    rand = simulate(job(rounds=8), scheduler="random")
    for sim in (fast, rand):
        for o in sim.result.outcomes:
            assert o.global_metrics["deadline_s"] > 0
            for r in o.with_status("valid"):
                m = r.metrics
                assert m["received_s"] == pytest.approx(m["train_time_s"] + m["comm_time_s"])
                assert m["cpu_time_s"] == m["train_time_s"] > 0 and 0 <= m["accuracy"] <= 1
    # after the first rounds have profiled clients, fast's rounds are shorter than random's
    assert statistics.mean(latencies(fast)[8:]) < 0.7 * statistics.mean(latencies(rand)[8:])
    assert fast.loop.now() < rand.loop.now()


def test_a_tight_deadline_fails_late_clients_and_counts_their_wasted_compute():
    sim = simulate(job(rounds=4), scheduler="random", deadline_s=3.0)
    late = [r for o in sim.result.outcomes for r in o.with_status("failed")]
    assert late and all("deadline" in r.reason for r in late)
    assert all(r.metrics["cpu_time_s"] > 0 and r.metrics["train_time_s"] + r.metrics["comm_time_s"] > 3.0
               for r in late)  # the wasted work is in the record
    for o in sim.result.outcomes:
        assert o.duration_s <= 3.0 + 1e-9
        assert all(r.metrics["received_s"] <= 3.0 for r in o.with_status("valid"))


def test_unavailable_clients_are_never_selected_and_offline_ones_drop():
    sim = simulate(job(clients=60, rounds=10), scheduler="random",
                   world=WorldConfig(availability="synthetic", mean_on_s=4.0, mean_off_s=4.0))
    start, offered = 0.0, 0
    for o in sim.result.outcomes:
        for cid in o.selected:
            assert sim.world.availability.is_active(cid, start)
        offered += len(o.selected)
        start += o.duration_s
    dropped = [r for o in sim.result.outcomes for r in o.with_status("failed") if "offline" in r.reason]
    assert offered and dropped  # seconds-long sessions: some clients leave mid-round
    assert all(r.metrics["cpu_time_s"] <= r.metrics.get("train_time_s", 0) + 1e-9 for r in dropped)


def test_a_client_slowed_down_mid_run_is_retiered_and_fast_stops_picking_it():
    probe = simulate(job(clients=24, rounds=4), scheduler="fast")
    counts: dict[int, int] = {}
    for o in probe.result.outcomes[1:]:
        for cid in o.selected:
            counts[cid] = counts.get(cid, 0) + 1
    favourite = max(sorted(counts), key=counts.get)
    slow_at = probe.result.outcomes[0].duration_s + probe.result.outcomes[1].duration_s  # end of round 2
    sim = simulate(job(clients=24, rounds=16), scheduler="fast",
                   world=WorldConfig(slowdowns=(Slowdown(favourite, slow_at, 50.0),)))
    picked = [favourite in o.selected for o in sim.result.outcomes]
    assert any(picked[:2]) and not any(picked[-6:])
    tiers = sim.coordinator.strategy.selector.tiers
    assert tiers.tier_of(favourite) == tiers.num_tiers - 1  # re-tiered into the slowest tier


def test_tiff_with_adaptive_schedules_among_the_providers_tiff_trusts():
    attackers = {cid: "label-flip" for cid in range(0, 30, 3)}
    sim = simulate(job(clients=30, per_round=5, rounds=6, strategy="tiff"), attacks=attackers, scheduler="adaptive")
    selector = sim.coordinator.strategy.selector
    assert isinstance(selector, GatedScheduler) and selector.scheduler.name == "adaptive"
    assert all(len(o.selected) == 5 for o in sim.result.outcomes)


def test_same_seed_same_selection_trace_and_results_twice():
    options = dict(scheduler="adaptive", world=WorldConfig(availability="synthetic", mean_on_s=300.0,
                                                           slowdown_fraction=0.3, slowdown_horizon_s=100.0))
    first, second = (simulate(job(rounds=5), **options) for _ in range(2))
    assert [o.selected for o in first.result.outcomes] == [o.selected for o in second.result.outcomes]
    assert first.coordinator.store.read_log("fl_rounds") == second.coordinator.store.read_log("fl_rounds")
    assert first.result.client_accuracy == second.result.client_accuracy
    other = simulate(job(rounds=5, seed=1), **options)
    assert [o.selected for o in other.result.outcomes] != [o.selected for o in first.result.outcomes]


def test_resuming_with_another_scheduler_is_refused(tmp_path):
    with MetaStore(tmp_path / "fl.db") as store:
        simulate(job(rounds=2), store=store, scheduler="oort")
    with MetaStore(tmp_path / "fl.db") as store, pytest.raises(JobMismatch, match="scheduler"):
        simulate(job(rounds=3), store=store, scheduler="tifl")
    with MetaStore(tmp_path / "fl.db") as store:  # the same scheduler resumes, with its memory
        sim = simulate(job(rounds=3), store=store, scheduler="oort")
        assert [o.round for o in sim.result.outcomes] == [3]


def test_free_weights_and_bad_names_are_checked():
    sim = simulate(job(rounds=2), scheduler="fast", weights={"fast": 0.5, "rfair": 0.5})
    assert sim.coordinator.strategy.selector.weights == {"fast": 0.5, "rfair": 0.5, "afair": 0.0, "perf": 0.0, "util": 0.0}
    with pytest.raises(ValueError, match="free weights"):
        SimulationOptions(scheduler="oort", weights={"fast": 1.0}).make_scheduler()
    with pytest.raises(KeyError, match="choose from"):
        SimulationOptions(scheduler="fastest").make_scheduler()


def test_a_simulated_time_budget_ends_the_job_at_the_first_round_past_it():
    unlimited = simulate(job(rounds=6), scheduler="random")
    ends = [sum(o.duration_s for o in unlimited.result.outcomes[:i + 1]) for i in range(6)]
    budget = (ends[2] + ends[3]) / 2  # inside round 4
    limited = simulate(job(rounds=6), scheduler="random", time_budget_s=budget)
    assert [o.selected for o in limited.result.outcomes] == [o.selected for o in unlimited.result.outcomes[:4]]
    assert len(limited.result.client_accuracy) == 10  # the job still ends with its evaluation
