"""marble's order inside a queue (estimated remaining time on one GPU) and its own LAS queues."""
import pytest
from sched_toy import LINEAR, SUB, job, state_with, toy_model

from mlsyskit.core.config import ConfigError
from mlsyskit.tools.sched.cluster import ClusterSpec
from mlsyskit.tools.sched.policies import PolicyOptions, create_policy
from mlsyskit.tools.sched.state import Start

MODEL = toy_model({"lin": LINEAR, "sub": SUB})


def started(decision):
    return {a.job_id: sum(a.shape) for a in decision.actions if isinstance(a, Start)}


def test_a_job_asking_many_gpus_is_not_ranked_behind_a_longer_one_asking_few():
    # sub (asks 6, p* 4: 32 samples/s) has 1000 samples left, lin (asks 2) 1100; both 10/s on one
    # GPU. On one GPU sub is the shorter (100 s vs 110 s); GPU-seconds on p* (125 vs 110) said lin.
    state = state_with(ClusterSpec(1, 4), [job(1, "sub", 6, 1.0), job(2, "lin", 2, 1.0)],
                       history={"sub": [1000.0], "lin": [1100.0]})
    assert started(create_policy("marble-admit", MODEL).decide(state)) == {1: 4}


def test_marble_thresholds_are_marbles_own_and_empty_means_one_queue():
    # j1 attained 2 h of GPU time and has 100 samples left; j2 is new with 1000 left (same app)
    def state():
        s = state_with(ClusterSpec(1, 2), [job(1, "lin", 2, 1.0), job(2, "lin", 2, 1.0)], now=10.0,
                       history={"lin": [1100.0, 1100.0, 1100.0]})
        s.queue[1].attained, s.queue[1].progress = 7200.0, 1000.0
        return s
    # with LAS queues the newcomer (level 0) goes first, whatever tiresias' thresholds are
    las = PolicyOptions(marble_thresholds=(3600.0,), tiresias_thresholds=(1e9,))
    assert set(started(create_policy("marble-admit", MODEL, las).decide(state()))) == {2}
    # one queue: the shortest estimated remaining time first
    one = PolicyOptions(marble_thresholds=(), tiresias_thresholds=(3600.0,))
    assert set(started(create_policy("marble-admit", MODEL, one).decide(state()))) == {1}
    # tiresias keeps its own: with (3600,) the newcomer goes first
    assert set(started(create_policy("tiresias", MODEL, one).decide(state()))) == {2}


def test_marble_options_are_checked():
    for bad in ({"marble_thresholds": (10.0, 5.0)}, {"marble_thresholds": (0.0,)}, {"marble_grow_gain": -1.0}):
        with pytest.raises(ConfigError, match="marble_"):
            PolicyOptions(**bad)
