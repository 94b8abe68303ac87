"""Registered sample counts reach the selector (coordinator -> selector, also after a restart, also through TIFF's
gate), and Oort explores by them as FedScale's code does: the sample_window x n largest, drawn by size."""
from __future__ import annotations

import random

from mlsyskit.core.storage import MetaStore
from mlsyskit.tools.fl.config import DataSpec, JobConfig
from mlsyskit.tools.fl.coordinator import Coordinator
from mlsyskit.tools.fl.outcome import ClientReport, RoundOutcome
from mlsyskit.tools.fl.scheduling.hetero import HeteroConfig, HeteroScheduler
from mlsyskit.tools.fl.scheduling.oort import OortConfig, OortScheduler


def explored(config, sizes, k=10, draws=50):
    picks = []
    for r in range(draws):
        oort = OortScheduler(config)
        oort.register_clients(sizes)
        picks.append(oort.select(1, list(range(100)), k, random.Random(r)))  # round 1: every slot explores
    return picks


def test_oort_explores_the_largest_registered_clients_first():
    sizes = {cid: 10 + cid for cid in range(100)}  # client 99 holds the most data
    by_size = explored(OortConfig(explore_by="size"), sizes)
    assert all(len(p) == 10 and min(p) >= 50 for p in by_size)  # within the 5 x 10 largest
    mean_pick = sum(map(sum, by_size)) / (10 * len(by_size))
    assert mean_pick > 75.5  # drawn in proportion to size: the big end of the window more often
    uniform = explored(OortConfig(explore_by="random"), sizes)
    assert any(min(p) < 50 for p in uniform)  # the paper's rule: any unexplored client
    # without registered counts (a real client that sent none) FedScale's rule falls back to uniform draws
    assert explored(OortConfig(explore_by="size"), {}) == uniform


def test_coordinator_tells_the_selector_registered_counts_and_again_on_restart():
    for strategy in ("fedavg", "tiff"):  # tiff: the scheduler sits behind TIFF's gate
        config = JobConfig(strategy=strategy, scheduler="oort", rounds=1, per_round=2,
                           data=DataSpec(num_clients=3, seed=5))
        with MetaStore(":memory:") as store:
            c = Coordinator(config, store)
            c.register_many({0: {"num_samples": 7}, 1: {"num_samples": 9}, 2: {}})
            oort = getattr(c.strategy.selector, "scheduler", c.strategy.selector)
            assert isinstance(oort, OortScheduler)
            assert oort.registered_samples == {0: 7, 1: 9}  # a client without a count is not guessed
            again = Coordinator(config, store)
            oort = getattr(again.strategy.selector, "scheduler", again.strategy.selector)
            assert oort.registered_samples == {0: 7, 1: 9}


def test_adaptive_can_explore_by_size_and_price_unmeasured_clients_by_their_count():
    sizes = {cid: 10 + cid for cid in range(100)}
    by_size = HeteroScheduler(HeteroConfig(explore=1.0, explore_by="size"))
    by_size.register_clients(sizes)
    assert min(by_size.select(1, list(range(100)), 10, random.Random(0))) >= 50
    uniform = HeteroScheduler(HeteroConfig(explore=1.0))
    uniform.register_clients(sizes)
    assert min(uniform.select(1, list(range(100)), 10, random.Random(0))) < 50
    # utility of a measured client: samples x sqrt(loss^2) = 2 x its count here; an unmeasured one is priced at
    # its registered count x that median rate with util_prior "size", and left to the median without it
    reports = {c: ClientReport(c, {"num_samples": sizes[c], "loss": 2.0, "train_time_s": 1.0, "cpu_time_s": 1.0})
               for c in (0, 1, 2)}
    for prior, expected in (("size", {0: 20.0, 1: 22.0, 2: 24.0, 90: 200.0}), ("median", {0: 20.0, 1: 22.0, 2: 24.0})):
        scheduler = HeteroScheduler(HeteroConfig(util_prior=prior))
        scheduler.register_clients(sizes)
        scheduler.observe(RoundOutcome(1, [0, 1, 2], reports, {"accuracy": 0.5}))
        assert scheduler.expected_utility([0, 1, 2, 90]) == expected
