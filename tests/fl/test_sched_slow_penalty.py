"""HeteroConfig.slow_penalty (adaptive's: 1 on afair): a knob scores a slow client down by how slow it is, as Oort's
duration penalty scales its utility, so a fairness knob takes a slow device only when its term outweighs the time."""
from __future__ import annotations

import random

import pytest

from mlsyskit.core.config import ConfigError
from mlsyskit.tools.fl.outcome import ClientReport, RoundOutcome
from mlsyskit.tools.fl.scheduling.hetero import HeteroConfig, HeteroScheduler

# client -> (samples, seconds a sample, accuracy): 0-3 fast devices the model serves well; 4-5 slow devices it
# serves worst; 6-7 hold 10x the data on fast devices (slow rounds, not slow devices), served worse than 0-3
CLIENTS = {**{c: (10, 0.01, 0.9) for c in range(4)}, 4: (10, 0.1, 0.1), 5: (10, 0.1, 0.1),
           6: (100, 0.01, 0.5), 7: (100, 0.01, 0.5)}


ALL = ("rfair", "afair", "perf", "util")


def observed(**config) -> HeteroScheduler:
    config = {"slow_penalty": 0.0} | config
    scheduler = HeteroScheduler(HeteroConfig(weights={"fast": 0.25, "afair": 0.75}, explore=0.0, fast_pool=1.0,
                                             fast_cutoff="pool", **config))
    reports = {c: ClientReport(c, {"num_samples": n, "loss": 1.0, "train_time_s": n * per, "cpu_time_s": n * per,
                                   "accuracy": acc}) for c, (n, per, acc) in CLIENTS.items()}
    scheduler.observe(RoundOutcome(1, sorted(CLIENTS), reports, {"accuracy": 0.3}))
    return scheduler


def pick(scheduler: HeteroScheduler) -> list[int]:
    return scheduler.select(2, list(CLIENTS), 2, random.Random(0))


def test_without_the_penalty_afair_takes_the_slow_devices():
    assert pick(observed()) == [4, 5]
    assert observed().slowdowns(list(CLIENTS), {c: 1.0 for c in CLIENTS}, 0.5) == {}


def test_by_latency_every_slow_round_is_penalised():
    scheduler = observed(slow_penalty=1.0, slow_knobs=ALL)
    # L* (pool 1 x k=2 of 8: the 25th percentile) = 0.1 s: clients 4-7 (1 s) keep a tenth of their afair term
    assert scheduler.terms(list(CLIENTS), k=2)["afair"][4] == pytest.approx(0.1 * observed().terms(
        list(CLIENTS), k=2)["afair"][4])
    assert set(pick(scheduler)) <= {0, 1, 2, 3}  # and a round of 1 s costs more than their gap is worth
    only_afair = observed(slow_penalty=1.0).terms(list(CLIENTS), k=2)  # the default knobs: afair alone
    assert only_afair["afair"][4] == scheduler.terms(list(CLIENTS), k=2)["afair"][4]
    assert only_afair["rfair"][4] == observed().terms(list(CLIENTS), k=2)["rfair"][4]  # rfair left as it was
    with pytest.raises(ConfigError):
        HeteroConfig(slow_knobs=("fast",))


def test_adaptive_penalises_slow_clients_by_default_the_other_presets_do_not():
    assert HeteroConfig(preset="adaptive").penalty() == 1.0 and HeteroConfig(preset="adaptive").slow_knobs == ("afair",)
    assert HeteroConfig(preset="afair").penalty() == HeteroConfig(preset="fast").penalty() == 0.0
    assert HeteroConfig(preset="adaptive", slow_penalty=0.0).penalty() == 0.0
    assert pick(observed(slow_penalty=None)) != [4, 5]  # adaptive's own: afair no longer takes the slow devices


def test_per_sample_penalises_slow_devices_not_clients_with_much_data():
    scheduler = observed(slow_penalty=1.0, slow_by="per-sample", slow_knobs=ALL)
    slow = scheduler.slowdowns(list(CLIENTS), {}, 0.0)
    assert set(slow) == {4, 5} and slow[4] == pytest.approx(0.1)  # 10 samples/s against the median 100
    assert pick(scheduler) == [6, 7]  # worse served than 0-3, on devices as fast: their data is worth the round
    with pytest.raises(ConfigError):
        HeteroConfig(slow_penalty=-1.0)
    with pytest.raises(ConfigError):
        HeteroConfig(slow_by="throughput")


def test_an_explore_draw_does_not_hold_the_round_when_deadline_skips_explored():
    def profiled(**config) -> HeteroScheduler:
        scheduler = HeteroScheduler(HeteroConfig(weights={"fast": 1.0}, explore=0.5, slow_penalty=0.0, **config))
        latency = {0: 1.0, 1: 1.0, 2: 1.0, 3: 1.0, 4: 50.0}
        reports = {c: ClientReport(c, {"num_samples": 10, "loss": 1.0, "train_time_s": t, "cpu_time_s": t})
                   for c, t in latency.items()}
        scheduler.observe(RoundOutcome(1, sorted(latency), reports, {"accuracy": 0.3}))
        return scheduler

    seed = next(s for s in range(100) if 4 in profiled().select(2, list(range(5)), 2, random.Random(s)))
    holds, skips = profiled(), profiled(deadline_skips_explored=True)
    picked = holds.select(2, list(range(5)), 2, random.Random(seed))
    assert skips.select(2, list(range(5)), 2, random.Random(seed)) == picked and skips.exploring == {4}
    assert holds.round_deadline(picked) == pytest.approx(75.0)  # 1.5 x the explored client's 50 s
    assert skips.round_deadline(picked) == pytest.approx(1.5)  # the exploited client's round; 4 is measured late
    assert skips.round_deadline([4]) == pytest.approx(75.0)  # a round of explore draws only: theirs
