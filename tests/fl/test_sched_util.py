"""`util`, Oort's statistical utility as one of our knobs: a client with more data the model still gets wrong
scores higher; one absurd loss gains nothing over the cap; a late update teaches nothing; state survives a restart."""
from __future__ import annotations

import json
import random

import pytest

from mlsyskit.core.config import ConfigError
from mlsyskit.tools.fl.outcome import ClientReport, RoundOutcome
from mlsyskit.tools.fl.scheduling.hetero import HeteroConfig, HeteroScheduler

# client -> (samples, loss): equal devices; 0-3 hold much data the model gets wrong, 4-7 little it gets right
CLIENTS = {c: (100, 2.0) if c < 4 else (10, 0.5) for c in range(8)}


def observed(late=(), forged=None, **config) -> HeteroScheduler:
    scheduler = HeteroScheduler(HeteroConfig(weights={"util": 1.0}, explore=0.0, **config))
    reports = {}
    for c, (n, loss) in CLIENTS.items():
        m = {"num_samples": n, "loss": forged if c == 7 and forged else loss, "train_time_s": 1.0, "cpu_time_s": 1.0}
        reports[c] = ClientReport(c, m, status="failed", reason="deadline 5.0s missed") if c in late else ClientReport(c, m)
    scheduler.observe(RoundOutcome(1, sorted(CLIENTS), reports, {"accuracy": 0.3, "deadline_s": 5.0}))
    return scheduler


def test_util_takes_the_clients_with_most_to_teach():
    scheduler = observed()
    assert scheduler.select(2, list(CLIENTS), 4, random.Random(0)) == [0, 1, 2, 3]
    terms = scheduler.terms(list(CLIENTS), k=4)["util"]
    assert terms[0] == 1.0 and terms[4] == pytest.approx(10 * 0.5 / (100 * 2.0))
    assert scheduler.terms([99], k=1)["util"][99] == 0.5  # never trained: unknown


def test_a_forged_loss_is_capped_and_a_late_update_carries_no_utility():
    forged = observed(forged=1e9, util_clip=50.0)  # cap at the median: client 7's claim counts as the cap
    terms = forged.terms(list(CLIENTS), k=4)["util"]
    assert terms[7] == terms[0] == 1.0
    late = observed(late=(0, 1))
    assert 0 not in late.utility and 1 not in late.utility and late.utility[2] == pytest.approx(200.0)
    with pytest.raises(ConfigError):
        HeteroConfig(util_clip=0.0)


def test_util_state_round_trips_and_old_state_loads():
    scheduler = observed()
    state = json.loads(json.dumps(scheduler.state_dict()))
    restored = HeteroScheduler(HeteroConfig(weights={"util": 1.0}, explore=0.0))
    restored.load_state_dict(state)
    assert restored.utility == scheduler.utility
    del state["utility"], state["weights"]["util"]  # saved before util existed
    restored.load_state_dict(state)
    assert restored.utility == {} and restored.weights["util"] == 0.0


def test_utility_rate_cutoff_buys_the_most_utility_per_second():
    from mlsyskit.tools.fl.scheduling.utility_rate import utility_rate_cutoff

    latency = {0: 1.0, 1: 1.0, 2: 2.0, 3: 2.0, 4: 10.0}
    # k=2: at 1 s the two fast ones teach 2 (rate 2); at 2 s the two useful ones 20 (rate 10); at 10 s 20 (rate 2)
    assert utility_rate_cutoff(latency, {0: 1.0, 1: 1.0, 2: 10.0, 3: 10.0, 4: 1.0}, 2) == 2.0
    assert utility_rate_cutoff(latency, {0: 1.0, 1: 1.0, 2: 1.0, 3: 1.0, 4: 1.0}, 2) == 1.0  # equal: the fastest
    # unknown ones count as the median known (10): the two fast ones teach 20 in 1 s
    assert utility_rate_cutoff(latency, {2: 10.0, 3: 10.0, 4: 1.0}, 2) == 1.0
    assert utility_rate_cutoff({}, {}, 2) is None
    scheduler = HeteroScheduler(HeteroConfig(weights={"fast": 1.0}, fast_cutoff="utility-rate", explore=0.0))
    reports = {c: ClientReport(c, {"num_samples": 100 if c in (2, 3) else 10, "loss": 1.0, "train_time_s": t,
                                   "cpu_time_s": t}) for c, t in latency.items()}
    scheduler.observe(RoundOutcome(1, sorted(latency), reports, {"accuracy": 0.3}))
    terms = scheduler.terms(sorted(latency), k=2)["fast"]
    assert terms == {0: 1.0, 1: 1.0, 2: 1.0, 3: 1.0, 4: pytest.approx(0.2)}  # everyone within 2 s ties
    with pytest.raises(ConfigError):
        HeteroConfig(fast_cutoff="median")


def test_adaptive_cuts_fast_by_utility_rate_the_other_presets_by_pool():
    assert HeteroConfig(preset="adaptive").cutoff() == "utility-rate"
    assert HeteroConfig(preset="fast").cutoff() == HeteroConfig(preset="afair").cutoff() == "pool"
    assert HeteroConfig(preset="adaptive", fast_unit="per-sample").cutoff() == "pool"  # rates need latencies
    assert HeteroConfig(preset="adaptive", fast_cutoff="pool").cutoff() == "pool"
    with pytest.raises(ConfigError):
        HeteroConfig(fast_cutoff="utility-rate", fast_unit="per-sample")
