"""Oort's two pacer rules (the paper's and FedScale's code), FedScale's wider exploitation pool, and the
plateau detector's two rules and the floor under fast (adaptive's adaptation)."""
from __future__ import annotations

import random

import pytest

from mlsyskit.core.config import ConfigError
from mlsyskit.tools.fl.outcome import ClientReport, RoundOutcome
from mlsyskit.tools.fl.scheduling.base import TrackingConfig
from mlsyskit.tools.fl.scheduling.oort import OortConfig, OortScheduler
from mlsyskit.tools.fl.scheduling.trend import PlateauDetector


def outcome(round_num, selected, loss=1.0):
    reports = {cid: ClientReport(cid, {"num_samples": 10, "loss": loss, "train_time_s": 1.0 + cid, "cpu_time_s": 1.0})
               for cid in selected}
    return RoundOutcome(round_num, list(selected), reports, {"accuracy": 0.5})


def run_rounds(scheduler, losses):
    for r, loss in enumerate(losses, start=1):
        scheduler.exploited = {1, 2}  # as if select() had exploited them
        scheduler.observe(outcome(r, [1, 2, 3], loss))


def test_fedscale_pacer_relaxes_when_utility_is_flat_and_tightens_when_it_jumps():
    flat = OortScheduler(OortConfig(pacer_rule="flat", pacer_window=2, pacer_step=5))
    run_rounds(flat, [1.0, 1.0, 1.05, 1.0])
    assert flat.threshold == 35.0  # rounds 3-4 within 10% of rounds 1-2: admit slower clients
    run_rounds(flat, [1.0, 1.0, 1.0, 1.0, 9.0, 9.0])
    assert flat.threshold == 35.0 + 5 + 5 - 5  # flat twice, then a 9x jump: tightened back by one step
    # the paper's rule on the same utility: it never fell, so the threshold never moved
    paper = OortScheduler(OortConfig(pacer_rule="falling", pacer_window=2, pacer_step=5))
    run_rounds(paper, [1.0, 1.0, 1.05, 1.0, 1.2, 1.2])
    assert paper.threshold == 30.0
    run_rounds(paper, [1.2, 1.2, 0.5, 0.5])
    assert paper.threshold == 35.0  # rounds 9-10 below 7-8: relaxed once
    # the flat rule measures only the exploited clients: client 3 (explored) changes nothing
    state = flat.state_dict()
    again = OortScheduler(OortConfig(pacer_rule="flat", pacer_window=2, pacer_step=5))
    again.load_state_dict(state)
    assert again.threshold == flat.threshold and again.exploited == flat.exploited
    with pytest.raises(ConfigError):
        OortConfig(pacer_rule="sometimes")


def test_fedscale_pool_samples_beyond_the_cutoff_and_the_paper_does_not():
    def picks(config):
        scheduler = OortScheduler(config)
        for cid in range(40):  # explored clients, utility falling with the id, all equally fast
            scheduler.stat_utility[cid] = 100.0 - 2 * cid
            scheduler.last_round[cid] = 1
        seen = set()
        for r in range(200):
            seen.update(scheduler.select(200, list(range(40)), 10, random.Random(r)))
        return seen

    paper = picks(OortConfig())
    fedscale = picks(OortConfig(cutoff=0.05, pool_factor=10))
    assert max(paper) < 20  # only clients within 0.95 x the 7th's utility (7 exploited slots at eps 0.3)
    assert max(fedscale) == 39  # the pool holds >= 10 x 7 ranked clients: everyone gets a chance


def test_plateau_mean_rule_ignores_a_noisy_climb_but_sees_a_flat_curve():
    # MNIST-1D's shape: +0.003 a round under +-0.04 of round-to-round noise
    rng = random.Random(0)
    climb = [0.2 + 0.003 * r + rng.uniform(-0.04, 0.04) for r in range(80)]
    flat = [0.45 + rng.uniform(-0.04, 0.04) for _ in range(80)]

    def fired(values, **rule):
        detector = PlateauDetector(**rule)
        count = 0
        for v in values:
            detector.record(v)
            count += detector.plateaued()
        return count

    default = TrackingConfig()
    assert (default.plateau_window, default.plateau_rule) == (5, "best")  # adaptive's (README: mean not adopted)
    assert fired(climb, window=5, min_gain=0.005, rule="best") >= 10  # a spike sets the bar
    chosen = {"window": 10, "min_gain": 0.005, "rule": "mean"}
    assert fired(climb, **chosen) <= 2
    assert fired(flat, **chosen) >= 30  # a real plateau still fires
    with pytest.raises(ConfigError):
        PlateauDetector(rule="median")
    with pytest.raises(ConfigError):
        TrackingConfig(plateau_rule="median")


def test_adaptive_plateau_shifts_keep_fast_at_its_floor():
    from mlsyskit.tools.fl.scheduling.hetero import HeteroConfig, HeteroScheduler

    def flat_run(config):
        adaptive = HeteroScheduler(config)
        for r in range(1, 61):
            chosen = adaptive.select(r, list(range(30)), 5, random.Random(r))
            adaptive.observe(outcome(r, chosen))  # accuracy 0.5 every round: a plateau
        return adaptive

    kept = flat_run(HeteroConfig())
    assert len(kept.shifts) >= 5 and kept.weights["fast"] == pytest.approx(0.25)  # the default floor
    assert sum(kept.weights.values()) == pytest.approx(1.0)
    spent = flat_run(HeteroConfig(fast_floor=0.0))
    assert spent.weights["fast"] == 0.0
    with pytest.raises(ConfigError):
        HeteroConfig(fast_floor=1.5)
