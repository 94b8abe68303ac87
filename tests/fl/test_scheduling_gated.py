"""A scheduler composed with TIFF's trust: it schedules only among the providers TIFF would use."""
from __future__ import annotations

import json
import random

from mlsyskit.tools.fl.config import SelectionConfig
from mlsyskit.tools.fl.outcome import ClientReport, RoundOutcome
from mlsyskit.tools.fl.scheduling.gated import GatedScheduler
from mlsyskit.tools.fl.scheduling.harness import HarnessConfig, run
from mlsyskit.tools.fl.scheduling.hetero import HeteroConfig
from mlsyskit.tools.fl.selection.trusted_random import TrustedRandomSelector
from mlsyskit.tools.fl.selectors import make_selector

ATTACKERS = set(range(5))  # also the fastest clients: a speed-only scheduler loves them


def outcome(round_num, selected):
    reports = {c: ClientReport(c, {"num_samples": 10, "loss": 1.0, "train_time_s": 1.0 + c, "cpu_time_s": 1.0 + c,
                                   "quality": 0.0 if c in ATTACKERS else 0.8}) for c in selected}
    return RoundOutcome(round_num, list(selected), reports, {"accuracy": 0.5})


def gated(fast_pool=3.0):
    gate = TrustedRandomSelector(SelectionConfig(epsilon=0.0, epsilon_min=0.0))
    return GatedScheduler(gate, make_selector("fast", HeteroConfig(preset="fast", fast_pool=fast_pool)), pool_factor=3)


def drive(selector, rounds):
    trace = []
    for r in range(1, rounds + 1):
        chosen = selector.select(r, list(range(30)), 4, random.Random(r))
        trace.append(chosen)
        selector.observe(outcome(r, chosen))
    return trace


def test_fast_inside_tiff_trust_avoids_distrusted_fast_clients():
    # fast_pool 0: only the very fastest score 1, so fast alone keeps picking the fast attackers
    plain = drive(make_selector("fast", HeteroConfig(preset="fast", fast_pool=0.0)), 30)
    assert sum(c in ATTACKERS for chosen in plain[-10:] for c in chosen) >= 20
    composed = gated(fast_pool=0.0)  # the fastest of TIFF's pool, not a rotation among them
    trace = drive(composed, 30)
    picks = [c for chosen in trace for c in chosen if c in ATTACKERS]
    assert len(picks) == len(set(picks))  # TIFF tries an unseen client once, then distrusts it
    late = [c for chosen in trace[-10:] for c in chosen]
    assert sum(c < 15 for c in late) > sum(c >= 15 for c in late)  # and within the pool, still the fast ones


def test_gated_state_round_trips_and_resumes():
    first = gated()
    drive(first, 12)
    second = gated()
    second.load_state_dict(json.loads(json.dumps(first.state_dict())))
    assert first.select(13, list(range(30)), 4, random.Random(5)) == second.select(13, list(range(30)), 4,
                                                                                   random.Random(5))
    assert first.round_deadline([5, 6]) == second.round_deadline([5, 6]) > 0


def test_gated_runs_in_the_harness():
    result = run(gated(), HarnessConfig(clients=30, per_round=4, rounds=8), seed=1)
    assert len(result.selections) == 8 and all(len(chosen) == 4 for chosen in result.selections)
