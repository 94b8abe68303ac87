"""The embedded coordinator backend in-process: compare-and-set epochs, persistence, liveness, the leader lock,
the orchestrator, and the protocol's handling of malformed requests."""
from __future__ import annotations

import json

import pytest

from mlsyskit.core.clock import VirtualClock
from mlsyskit.core.errors import UsageError
from mlsyskit.tools.kv.coord.base import EpochConflict
from mlsyskit.tools.kv.coord.embedded import EmbeddedCoordinator
from mlsyskit.tools.kv.coord.failover import ShardLost, plan_failover
from mlsyskit.tools.kv.coord.orchestrator import fail_over, join
from mlsyskit.tools.kv.coord.protocol import handle
from mlsyskit.tools.kv.shardmap import NodeAddr, layout


def first_map(mode: str = "ms-sc"):
    return layout(mode, "memory", 2, 3, "127.0.0.1", list(range(7000, 7006)))


@pytest.fixture
def coord(tmp_path):
    c = EmbeddedCoordinator(tmp_path, clock=VirtualClock())
    yield c
    c.close()


def test_initialize_is_idempotent_and_registers_the_nodes(coord):
    m = first_map()
    assert coord.read_map() is None
    assert coord.initialize(m) == m
    other = layout("aa-ec", "memory", 1, 1, "127.0.0.1", [1])
    assert coord.initialize(other) == m                     # an existing map is never overwritten
    assert sorted(coord.members()) == sorted(m.nodes)
    assert coord.live() == sorted(m.nodes)


def test_compare_and_set_bumps_the_epoch_and_refuses_stale_writers(coord):
    m = coord.initialize(first_map())
    new = plan_failover(m, ["s0r1"])
    assert coord.compare_and_set(m.epoch, new) == new
    with pytest.raises(EpochConflict) as info:              # a second planner acting on the old map loses
        coord.compare_and_set(m.epoch, plan_failover(m, ["s1r1"]))
    assert info.value.current == new.epoch
    with pytest.raises(UsageError, match="epoch 3"):        # a map must be exactly one epoch ahead
        coord.compare_and_set(new.epoch, plan_failover(plan_failover(new, ["s1r1"]), ["s1r2"]))
    assert coord.read_map() == new
    assert [h.epoch for h in coord.history()] == [1, 2]


def test_state_survives_reopening_at_the_same_epoch(tmp_path):
    c = EmbeddedCoordinator(tmp_path)
    m = c.initialize(first_map())
    c.compare_and_set(m.epoch, plan_failover(m, ["s0r0"]))
    c.close()
    again = EmbeddedCoordinator(tmp_path)
    try:
        assert again.read_map().epoch == 2 and again.read_map().shards[0] == ("s0r1", "s0r2")
        assert "s0r0" in again.members()                   # membership persists; liveness restarts
    finally:
        again.close()


def test_heartbeats_keep_nodes_live_and_silence_fails_them(coord):
    clock = coord.clock
    coord.initialize(first_map())
    for _ in range(9):                                       # the default timeout: 4 s (a loaded host)
        clock.advance(0.5)
        for n in coord.members():
            if n != "s1r2":
                assert coord.heartbeat(n) is True
        if clock.now() <= 4.0:
            assert coord.expire() == []
    assert coord.expire() == ["s1r2"]
    assert "s1r2" not in coord.live()
    fail_over(coord, ["s1r2"])
    assert coord.heartbeat("s1r2") is False                 # a deposed node must rejoin
    assert coord.heartbeat("stranger") is False


def test_orchestrator_fails_over_joins_and_refuses_to_empty_a_shard(coord):
    coord.initialize(first_map())
    after = fail_over(coord, ["s0r2"])
    assert after.epoch == 2 and after.shards[0] == ("s0r0", "s0r1")
    assert fail_over(coord, ["s0r2"]) is None               # already handled: no new epoch
    joined = join(coord, 0, NodeAddr("s0r3", "127.0.0.1", 7100))
    assert joined.epoch == 3 and joined.shards[0][-1] == "s0r3" and "s0r3" in coord.live()
    fail_over(coord, ["s0r0", "s0r1"])
    with pytest.raises(ShardLost):
        fail_over(coord, ["s0r3"])
    assert coord.read_map().shards[0] == ("s0r3",)          # the map was not emptied


def test_the_leader_lock_admits_one_coordinator_at_a_time(tmp_path):
    a, b = EmbeddedCoordinator(tmp_path), EmbeddedCoordinator(tmp_path)
    try:
        assert a.campaign("a", timeout_s=0) is True
        assert b.campaign("b", timeout_s=0.2) is False
        assert a.leader() == "a" and not b.is_leader()
        a.resign()
        assert b.campaign("b", timeout_s=1.0) is True and b.leader() == "b"
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("line", [
    b"not json", b"[1, 2]", b'{"op": 5}', b'{"op": "nope"}', b'{"op": "heartbeat"}',
    b'{"op": "cas", "expected_epoch": "1", "map": {}}', b'{"op": "cas", "expected_epoch": 1, "map": {"x": 1}}',
    b'{"op": "init", "map": {"epoch": 1, "controlet": "ms-sc", "datalet": "m", "shards": [["a"]], "nodes": []}}',
    b'{"op": "register", "node": "n", "host": "h", "port": 70000}',
    b'{"op": "register", "node": "n", "host": "h", "port": true}', b"\xff\xfe", b"[" * 100000,
])
def test_malformed_requests_get_bad_request_replies(coord, line):
    reply = handle(coord, line)
    assert reply["ok"] is False and reply["kind"] == "bad_request", reply
    assert coord.read_map() is None and coord.members() == {}


def test_protocol_round_trip_and_forged_cas(coord):
    m = first_map()
    assert handle(coord, json.dumps({"op": "init", "map": m.to_dict()}).encode())["map"]["epoch"] == 1
    forged = plan_failover(m, ["s0r0"]).to_dict()
    forged["epoch"] = 99                                    # a forged jump in epochs is refused
    reply = handle(coord, json.dumps({"op": "cas", "expected_epoch": 1, "map": forged}).encode())
    assert reply["ok"] is False and reply["kind"] == "refused"
    for victim, expected in (("s0r0", True), ("s1r0", False)):   # two planners on epoch 1: one wins
        reply = handle(coord, json.dumps({"op": "cas", "expected_epoch": 1,
                                          "map": plan_failover(m, [victim]).to_dict()}).encode())
        assert reply["ok"] is expected
    assert reply["kind"] == "conflict" and reply["epoch"] == 2
    assert handle(coord, b'{"op": "status"}')["epoch"] == 2


class ScriptedLive(EmbeddedCoordinator):
    """The embedded store, with the live list set by the test (as ZooKeeper's ephemeral znodes would be)."""

    now_live: list[str] = []

    def live(self) -> list[str]:
        return sorted(self.now_live)


def test_live_list_failover_waits_out_flaps_and_fails_over_once(tmp_path):
    from mlsyskit.tools.kv.coord.detector import DetectorConfig
    from mlsyskit.tools.kv.coord.watcher import LiveListFailover

    clock = VirtualClock()
    coord = ScriptedLive(tmp_path, clock=clock)
    try:
        coord.initialize(first_map())
        loop = LiveListFailover(coord, clock, DetectorConfig(interval_s=0.25, misses=2, min_timeout_s=0.0))  # as zk_main
        coord.now_live = []                                  # nobody registered yet: grace period
        loop.takeover()
        clock.advance(0.4)
        assert loop.step() is None
        coord.now_live = sorted(first_map().nodes)
        for _ in range(4):
            clock.advance(0.25)
            assert loop.step() is None
        coord.now_live = [n for n in first_map().nodes if n != "s1r0"]   # s1r0 flaps for 0.25 s
        clock.advance(0.25)
        assert loop.step() is None
        coord.now_live = sorted(first_map().nodes)
        clock.advance(0.25)
        assert loop.step() is None
        coord.now_live = [n for n in first_map().nodes if n != "s1r0"]   # now it is gone for good
        steps = []
        for _ in range(4):
            clock.advance(0.25)
            steps.append(loop.step())
        committed = [m for m in steps if m is not None]
        assert len(committed) == 1 and committed[0].shards[1] == ("s1r1", "s1r2")
        assert coord.read_map().epoch == 2
    finally:
        coord.close()


def test_ms_ec_failover_promotes_the_replica_that_reported_the_most_applied_writes(coord):
    coord.initialize(first_map("ms-ec"))
    for node, applied in (("s0r0", 10), ("s0r1", 4), ("s0r2", 8)):
        assert coord.heartbeat(node, applied)
    new = fail_over(coord, ["s0r0"], coord.applied())
    assert new.shards[0] == ("s0r2", "s0r1")


def test_a_failed_node_of_a_lost_shard_is_watched_again_but_a_deposed_one_is_not(coord):
    clock = coord.clock
    coord.initialize(layout("ms-sc", "memory", 1, 2, "127.0.0.1", [7001, 7002]))
    for _ in range(8):                                       # silent 4 s: not yet failed
        clock.advance(0.5)
        assert coord.expire() == []
    clock.advance(0.5)
    assert coord.expire() == ["s0r0", "s0r1"]
    with pytest.raises(ShardLost):
        fail_over(coord, ["s0r0", "s0r1"])
    assert coord.heartbeat("s0r1") is True                  # still in the map: not deposed
    assert coord.live() == ["s0r1"]
    for _ in range(3):
        clock.advance(0.5)
        assert coord.heartbeat("s0r1") and coord.expire() == []   # s0r0 stays failed, reported once
    assert fail_over(coord, ["s0r0"]).shards == (("s0r1",),)
    assert coord.heartbeat("s0r0") is False                 # deposed: must rejoin with a new id


def test_heartbeat_reply_carries_the_epoch_and_refuses_bad_counts(coord):
    coord.initialize(first_map())
    reply = handle(coord, b'{"op": "heartbeat", "node": "s0r0", "applied": 3}')
    assert reply == {"ok": True, "known": True, "epoch": 1}
    for bad in (b'-1', b'"3"', b'true', b'1.5'):
        reply = handle(coord, b'{"op": "heartbeat", "node": "s0r0", "applied": ' + bad + b'}')
        assert reply["kind"] == "bad_request", bad
    assert coord.applied() == {"s0r0": 3}
