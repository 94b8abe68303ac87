"""afair's per-client term: it favours the clients the current model serves worst, with staleness."""
from __future__ import annotations

import json
import random
from collections import Counter

import pytest

from mlsyskit.core.config import ConfigError
from mlsyskit.tools.fl.outcome import ClientReport, RoundOutcome
from mlsyskit.tools.fl.scheduling.base import TrackingConfig
from mlsyskit.tools.fl.scheduling.hetero import HeteroConfig, HeteroScheduler
from mlsyskit.tools.fl.selectors import make_selector

CLIENTS = range(40)


def poorly_served(cid):
    return cid % 4 == 1  # a quarter of the clients, spread over every latency tier


def client_accuracy(cid):
    return 0.25 if poorly_served(cid) else 0.8


def outcome(round_num, selected):
    reports = {c: ClientReport(c, {"num_samples": 20, "loss": 1.0, "train_time_s": 1.0 + c, "cpu_time_s": 1.0,
                                   "accuracy": client_accuracy(c)}) for c in selected}
    return RoundOutcome(round_num, list(selected), reports, {"accuracy": 0.6, "deadline_s": 100.0})


def poorly_served_share(scheduler, rounds=60, seed=0):
    picks = Counter()
    for r in range(1, rounds + 1):
        chosen = scheduler.select(r, list(CLIENTS), 5, random.Random(seed * 1000 + r))
        picks.update(chosen)
        scheduler.observe(outcome(r, chosen))
    return sum(n for c, n in picks.items() if poorly_served(c)) / sum(picks.values())


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_afair_picks_the_worst_served_clients_more_often_than_random_and_than_tiers_alone(seed):
    afair = poorly_served_share(make_selector("afair"), seed=seed)
    random_share = poorly_served_share(make_selector("random"), seed=seed)
    tiers_only = poorly_served_share(HeteroScheduler(HeteroConfig(preset="afair", afair_client_share=0.0)), seed=seed)
    # a quarter of the population is poorly served; random gives them about a quarter of the picks
    assert 0.15 < random_share < 0.35
    assert afair > 1.8 * random_share
    assert afair > 1.8 * tiers_only  # the tier term averages them away: the per-client term is what acts


def test_a_stale_reading_fades_to_unknown():
    afair = HeteroScheduler(HeteroConfig(preset="afair", afair_staleness_decay=0.5))
    afair.observe(outcome(1, [1, 2]))  # 1 is poorly served, 2 well
    fresh = afair.client_accuracy_terms([1, 2, 3])
    assert fresh == {1: 1.0, 2: 0.0}  # 3 never reported: no client term (0.5 in the score)
    for r in range(2, 6):
        afair.observe(outcome(r, [5]))  # another client reports; 1 and 2 grow stale
    stale = afair.client_accuracy_terms([1, 2])
    assert stale[1] == pytest.approx(0.5 + 0.5 * 0.5 ** 4)
    assert stale[2] == pytest.approx(0.5 - 0.5 * 0.5 ** 4)


def test_staleness_survives_a_restart_and_old_state_loads():
    afair = HeteroScheduler(HeteroConfig(preset="afair"))
    for r in range(1, 4):
        afair.observe(outcome(r, [r, r + 10]))
    state = json.loads(json.dumps(afair.state_dict()))
    resumed = HeteroScheduler(HeteroConfig(preset="afair"))
    resumed.load_state_dict(state)
    assert resumed.client_accuracy_terms(CLIENTS) == afair.client_accuracy_terms(CLIENTS)
    del state["accuracy_round"], state["latest_round"]  # saved before staleness was tracked
    old = HeteroScheduler(HeteroConfig(preset="afair"))
    old.load_state_dict(state)
    assert set(old.client_accuracy_terms(CLIENTS)) == set(afair.client_accuracy_terms(CLIENTS))


@pytest.mark.parametrize("bad", [{"afair_client_share": 1.5}, {"afair_staleness_decay": -0.1}])
def test_afair_constants_are_checked(bad):
    with pytest.raises(ConfigError):
        HeteroConfig(preset="afair", **bad)


def test_deadline_profiled_only_cuts_a_slow_explorer_at_the_profiled_clients_deadline():
    fast = make_selector("fast", tracking=TrackingConfig(deadline_profiled_only=True))
    fast.observe(outcome(1, [0, 1, 2]))  # latencies 1, 2, 3 s
    assert fast.round_deadline([0, 2, 30]) == pytest.approx(1.5 * 3.0)  # 30 is unprofiled
    assert make_selector("fast").round_deadline([0, 30]) == 1.5 * 600.0  # the default: the fallback counts


@pytest.mark.parametrize("name, pool, profiled_only", [("fast", 0.0, False), ("afair", 3.0, True),
                                                        ("adaptive", 0.0, True), ("rfair", 0.0, False)])
def test_presets_carry_their_tuned_pool_and_deadline_rule_unless_overridden(name, pool, profiled_only):
    scheduler = make_selector(name)
    assert (scheduler.config.pool(), scheduler.tracking.deadline_profiled_only) == (pool, profiled_only)
    assert HeteroConfig(preset=name, fast_pool=1.5).pool() == 1.5
