"""The pure control-plane pieces: failure detector on a virtual clock, failover planner, fencing rule."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlsyskit.core.clock import VirtualClock
from mlsyskit.core.errors import UsageError
from mlsyskit.tools.kv.coord.detector import DetectorConfig, FailureDetector
from mlsyskit.tools.kv.coord.failover import (
    MODES,
    Admit,
    PlanError,
    ShardLost,
    admit,
    plan_failover,
    plan_join,
    roles,
)
from mlsyskit.tools.kv.shardmap import NodeAddr, layout


def chain(mode: str = "ms-sc", shards: int = 1, replicas: int = 3, epoch: int = 1):
    return layout(mode, "memory", shards, replicas, "127.0.0.1",
                  list(range(7000, 7000 + shards * replicas)), epoch=epoch)


# -- failure detector ---------------------------------------------------------------------------
FAST = DetectorConfig(min_timeout_s=0.0)  # interval x misses only, as before the 4 s floor


def test_detector_defaults_are_half_second_beats_and_a_four_second_timeout():
    cfg = DetectorConfig()
    assert (cfg.interval_s, cfg.misses, cfg.timeout_s) == (0.5, 3, 4.0)  # floored: a loaded host
    assert FAST.timeout_s == 1.5 and DetectorConfig(interval_s=1.0, misses=10).timeout_s == 10.0
    assert DetectorConfig(interval_s=0.2).timeout_s == pytest.approx(1.6)  # the floor: 8 intervals
    assert DetectorConfig(min_timeout_s=6.0).timeout_s == 6.0


def test_detector_fails_after_three_missed_beats_and_reports_once():
    clock, det = VirtualClock(), FailureDetector(FAST)
    for n in ("a", "b"):
        det.watch(n, clock.now())
    reported = []
    for _ in range(10):                       # a beats every 0.5 s, b falls silent at t=0
        clock.advance(0.5)
        det.beat("a", clock.now())
        reported += [(clock.now(), n) for n in det.expire(clock.now())]
    assert reported == [(2.0, "b")]           # silent 1.5 s is not yet failed; the next check is
    assert det.failed() == ["b"]
    assert det.expire(clock.now()) == []      # reported once
    assert det.alive(clock.now()) == ["a"]


def test_detector_does_not_fail_at_exactly_the_timeout_and_does_at_the_next_instant():
    clock, det = VirtualClock(), FailureDetector(DetectorConfig(interval_s=0.2, misses=5, min_timeout_s=0.0))
    det.watch("n", 0.0)
    clock.set(1.0)
    assert det.expire(clock.now()) == []
    clock.set(1.0001)
    assert det.expire(clock.now()) == ["n"]


def test_a_failed_node_stays_failed_until_rewatched():
    det = FailureDetector(FAST)
    det.watch("n", 0.0)
    assert det.expire(1.0) == []
    assert det.expire(2.0) == ["n"]
    assert det.beat("n", 2.1) is False          # a late beat from a deposed node does not revive it
    assert det.alive(2.1) == []
    det.watch("n", 3.0)                         # it rejoined
    assert det.alive(3.1) == ["n"]


def test_detector_ignores_reordered_beats():
    det = FailureDetector(FAST)
    det.watch("n", 0.0)
    det.beat("n", 1.0)
    det.beat("n", 0.2)                          # a delayed older beat must not move the time back
    assert det.silence("n", 1.0) == 0.0


def test_detector_config_rejects_bad_values():
    with pytest.raises(UsageError):
        DetectorConfig(interval_s=0)
    with pytest.raises(UsageError):
        DetectorConfig(misses=0)


# -- failover planner: the rules per mode -------------------------------------------------------
def test_ms_sc_skips_a_failed_middle():
    new = plan_failover(chain(), ["s0r1"])
    assert new.shards == (("s0r0", "s0r2"),) and new.epoch == 2


def test_ms_sc_tail_replaced_by_predecessor_and_head_by_successor():
    assert roles(plan_failover(chain(), ["s0r2"]), 0) == {"s0r0": "head", "s0r1": "tail"}
    assert roles(plan_failover(chain(), ["s0r0"]), 0) == {"s0r1": "head", "s0r2": "tail"}


def test_ms_ec_promotes_the_most_advanced_replica():
    m = chain("ms-ec", replicas=4)
    new = plan_failover(m, ["s0r0"], progress={"s0r1": 5, "s0r2": 9, "s0r3": 9})
    assert new.shards[0] == ("s0r2", "s0r1", "s0r3")       # ties go to role order
    assert roles(new, 0)["s0r2"] == "master"
    assert plan_failover(m, ["s0r0"]).shards[0][0] == "s0r1"  # without progress: next in order


def test_aa_sc_sequencer_role_moves_and_aa_ec_drops_the_replica():
    assert roles(plan_failover(chain("aa-sc"), ["s0r0"]), 0) == {"s0r1": "sequencer", "s0r2": "replica"}
    assert plan_failover(chain("aa-ec"), ["s0r1"]).shards[0] == ("s0r0", "s0r2")


def test_other_shards_are_untouched():
    new = plan_failover(chain(shards=2), ["s1r0"])
    assert new.shards[0] == ("s0r0", "s0r1", "s0r2") and new.shards[1] == ("s1r1", "s1r2")


def test_losing_every_replica_is_refused():
    with pytest.raises(ShardLost, match="shard 0"):
        plan_failover(chain(), ["s0r0", "s0r1", "s0r2"])


def test_planner_refuses_unknown_nodes_and_modes():
    with pytest.raises(PlanError, match="nope"):
        plan_failover(chain(), ["nope"])
    bogus = layout("xx-yy", "memory", 1, 2, "127.0.0.1", [1, 2])
    with pytest.raises(PlanError, match="unknown controlet"):
        plan_failover(bogus, ["s0r0"])


def test_join_adds_the_replacement_last_with_an_epoch_bump():
    m = plan_failover(chain(), ["s0r2"])
    joined = plan_join(m, 0, NodeAddr("s0r3", "127.0.0.1", 7100))
    assert joined.shards[0] == ("s0r0", "s0r1", "s0r3") and joined.epoch == m.epoch + 1
    assert roles(joined, 0)["s0r3"] == "tail"
    with pytest.raises(PlanError, match="already"):
        plan_join(joined, 0, NodeAddr("s0r3", "127.0.0.1", 7100))
    with pytest.raises(PlanError, match="no shard 5"):
        plan_join(joined, 5, NodeAddr("x", "127.0.0.1", 1))
    assert roles(plan_join(chain("aa-sc"), 0, NodeAddr("n", "h", 1)), 0)["n"] == "replica"


# -- properties ---------------------------------------------------------------------------------
@settings(max_examples=300, deadline=None, derandomize=True)
@given(mode=st.sampled_from(MODES), shards=st.integers(1, 4), replicas=st.integers(1, 5),
       steps=st.lists(st.tuples(st.booleans(), st.integers(0, 10**6)), min_size=1, max_size=12))
def test_any_sequence_of_failures_and_joins_keeps_the_invariants(mode, shards, replicas, steps):
    m = chain(mode, shards, replicas)
    deposed: set[str] = set()
    fresh = 0
    for is_failure, pick in steps:
        before = m
        if is_failure:
            victim = sorted(m.nodes)[pick % len(m.nodes)]
            shard = m.shard_of_node(victim)
            try:
                m = plan_failover(m, [victim], progress={n: hash(n) % 7 for n in m.nodes})
            except ShardLost:
                assert m.shards[shard] == (victim,)   # refused only when nothing survives
                continue
            deposed.add(victim)
        else:
            fresh += 1
            m = plan_join(m, pick % len(m.shards), NodeAddr(f"new{fresh}", "127.0.0.1", 9000 + fresh))
        assert m.epoch == before.epoch + 1                          # epochs strictly increase
        for index, reps in enumerate(m.shards):
            assert len(reps) >= 1                                    # someone holds every role
            assert not deposed & set(reps)                           # a deposed node is never back
            role = roles(m, index)
            assert set(role) == set(reps)
        assert not deposed & set(m.nodes)
        assert set(m.nodes) == {n for reps in m.shards for n in reps}


# -- fencing ------------------------------------------------------------------------------------
def test_fencing_rule():
    m = chain(epoch=7)
    assert admit(7, "s0r0", m) is Admit.ACCEPT
    assert admit(6, "s0r0", m) is Admit.STALE_SENDER
    assert admit(0, "s0r0", m) is Admit.STALE_SENDER
    assert admit(8, "s0r0", m) is Admit.REFRESH_SELF
    new = plan_failover(m, ["s0r0"])
    assert admit(new.epoch, "s0r0", new) is Admit.DEPOSED     # the old head, once refreshed, refuses all
    assert admit(m.epoch, "s0r1", new) is Admit.STALE_SENDER  # a write sent by the deposed head is refused


@settings(max_examples=200, deadline=None, derandomize=True)
@given(node_epoch=st.integers(1, 50), request_epoch=st.integers(0, 60))
def test_fencing_accepts_only_the_same_epoch(node_epoch, request_epoch):
    verdict = admit(request_epoch, "s0r0", chain(epoch=node_epoch))
    assert (verdict is Admit.ACCEPT) == (request_epoch == node_epoch)


def test_a_pause_before_the_first_check_counts_as_a_stall():
    det = FailureDetector(FAST)
    det.watch("a", 0.0)
    assert det.expire(5.0) == [] and det.stalls == 1      # watched, then paused before any check
    assert det.expire(6.0) == []
    assert det.expire(6.6) == ["a"]                        # silent a full timeout after the resume


def test_a_paused_detector_does_not_fail_everyone_on_resume():
    det = FailureDetector(FAST)                      # timeout 1.5 s
    for n in ("a", "b"):
        det.watch(n, 0.0)
    assert det.expire(0.25) == []
    assert det.expire(10.0) == []                # the caller was paused for ~10 s: no verdict
    assert det.stalls == 1
    det.beat("a", 10.5)
    assert det.expire(10.75) == []
    det.beat("a", 11.0)
    assert det.expire(11.6) == ["b"]             # b stays silent a full timeout after the resume


def test_a_coordinator_starved_all_the_time_still_fails_a_dead_node():
    """Every check comes late (a loaded machine): the stalls are not counted against the nodes, but a
    node that stopped beating is still failed, where a fresh grace per stall would never fail it."""
    det = FailureDetector(FAST)                      # 0.5 s x 3
    det.watch("dead", 0.0)
    det.watch("live", 0.0)
    verdicts, now = [], 0.0
    while now < 30.0 and not verdicts:
        now += 2.0                               # every check 2 s after the last: each one a stall
        det.beat("live", now - 0.1)              # its beats are read just before the late check
        verdicts = det.expire(now)
    assert verdicts == ["dead"] and now <= 8.0
    assert det.stalls >= 3


def test_a_single_stall_gives_no_verdict_even_on_a_silent_node():
    det = FailureDetector(FAST)
    det.watch("a", 0.0)
    assert det.expire(1.0) == []
    assert det.expire(20.0) == []                # paused 19 s: a's silence grows by one interval (1.0 -> 1.5)
    assert det.silence("a", 20.0) == 1.5
