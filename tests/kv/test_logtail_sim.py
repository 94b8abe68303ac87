"""Catch-up by log tail and copy-then-join on the deterministic simulator (issue 15).

A replica a few writes behind copies only the messages after its position (streamlog.py), and
only when its source's history passed through the same position with the same checksum; every
other case (log evicted, requester ahead, another history) is a whole snapshot as before. A
learner copies a snapshot outside the map, joins, and then takes only the tail.
"""
from __future__ import annotations

import pytest

from mlsyskit.tools.kv.check.simulate import SimShard
from mlsyskit.tools.kv.controlets.base import ControletOptions, Snapshot
from mlsyskit.tools.kv.controlets.learner import Learner
from mlsyskit.tools.kv.controlets.ms_sc import ChainReplication
from mlsyskit.tools.kv.controlets.streamlog import StreamHistory

FAST = ControletOptions(write_timeout=0.5, sync_timeout=0.1, anti_entropy_interval=0.1)
VALUE = b"v" * 100


settle = SimShard.answer  # run virtual time until a request is answered


def start_together(shard: SimShard) -> None:
    """As `bespokv up` starts a shard: every replica catches up at once and the first one starts."""
    for n in shard.ids:
        shard._execute(n, shard.controlets[n].on_start())
    shard.run_for(1.0)
    assert all(c.ready for c in shard.controlets.values())
    assert all(c.history.chain is not None for c in shard.controlets.values())


def fill(shard: SimShard, at: str, n: int, prefix: bytes = b"k") -> None:
    for i in range(n):
        assert settle(shard, shard.submit(at, "put", prefix + b"%d" % i, VALUE)) == "OK"


def lose_two_writes_at_the_tail(shard: SimShard) -> None:
    """The middle's CHAIN messages to the tail are lost (the writes time out); then one more write."""
    shard.partition("r1", "r2")
    for key in (b"lost0", b"lost1"):
        assert str(settle(shard, shard.submit("r0", "put", key, b"x"))).startswith("TRYAGAIN")
    shard.heal()
    assert settle(shard, shard.submit("r0", "put", b"after", b"y")) == "OK"
    shard.run_for(0.3)


def test_a_tail_a_few_writes_behind_copies_the_log_tail_not_a_snapshot() -> None:
    shard = SimShard("ms-sc", replicas=3, seed=21, options=FAST)
    start_together(shard)
    fill(shard, "r0", 200)
    lose_two_writes_at_the_tail(shard)
    tail, middle = shard.controlets["r2"], shard.controlets["r1"]
    assert tail.gaps >= 1 and tail.copy["tails"] == 1 and tail.copy["snapshots"] == 1  # the start's
    assert middle.copy["tails_served"] == 1
    assert tail.tail_entries == 3  # lost0, lost1, after: not the 200 keys
    assert tail.copy["copied_bytes"] < 200 and tail.tail_bytes == tail.copy["copied_bytes"]
    assert shard.data["r2"][b"lost1"] == b"x" and shard.data["r2"][b"after"] == b"y"
    assert shard.converged()
    assert tail.history.chain == middle.history.chain == shard.controlets["r0"].history.chain


def test_a_log_that_no_longer_reaches_back_falls_back_to_a_snapshot() -> None:
    small = ControletOptions(write_timeout=0.5, sync_timeout=0.1, log_bytes=400)  # about two entries
    shard = SimShard("ms-sc", replicas=3, seed=22, options=small)
    start_together(shard)
    fill(shard, "r0", 20)
    shard.partition("r1", "r2")
    missed = [shard.submit("r0", "put", b"m%d" % i, VALUE) for i in range(6)]
    for req in missed:
        settle(shard, req)
    shard.heal()
    assert settle(shard, shard.submit("r0", "put", b"after", b"y")) == "OK"
    shard.run_for(0.3)
    tail = shard.controlets["r2"]
    assert tail.copy["tails"] == 0 and tail.copy["snapshots"] == 2
    assert shard.controlets["r1"].history.bytes <= 400
    assert shard.converged() and shard.data["r2"][b"m5"] == VALUE


def test_a_replica_ahead_of_its_promoted_master_gets_a_whole_snapshot() -> None:
    """ms-ec: r1 missed two writes, is promoted anyway (its poll fails), and renumbers; r2, which
    holds the old master's writes under the same numbers, must not take r1's tail."""
    shard = SimShard("ms-ec", replicas=3, seed=23, options=FAST)
    start_together(shard)
    fill(shard, "r0", 5)
    shard.run_for(0.2)
    shard.partition("r0", "r1")
    fill(shard, "r0", 2, prefix=b"old")  # r0 and r2 at 7, r1 at 5
    shard.run_for(0.2)
    shard.partition("r1", "r2")
    shard.reconfigure(["r1", "r2"])  # r0 failed; r1 promoted; its poll of r2 is lost
    shard.run_for(0.3)
    master = shard.controlets["r1"]
    assert master.ready and master.applied == 5
    shard.heal()
    for i in range(2):  # the same numbers 6 and 7, other writes
        assert settle(shard, shard.submit("r1", "put", b"new%d" % i, b"n")) == "OK"
    shard.run_for(1.5)
    replica = shard.controlets["r2"]
    assert replica.copy["tails"] == 0 and replica.copy["snapshots"] == 2
    assert master.copy["snapshots_served"] >= 1
    assert shard.converged() and b"old0" not in shard.data["r2"] and shard.data["r2"][b"new1"] == b"n"


def test_equal_numbers_with_another_history_are_not_confirmed() -> None:
    """Position 7 on both sides, different writes: the SEQAT checksum tells them apart."""
    shard = SimShard("ms-ec", replicas=3, seed=24, options=FAST)
    start_together(shard)
    fill(shard, "r0", 5)
    shard.run_for(0.2)
    shard.partition("r0", "r1")
    fill(shard, "r0", 2, prefix=b"old")
    shard.run_for(0.2)
    shard.partition("r1", "r2")
    shard.reconfigure(["r1", "r2"])
    shard.run_for(0.3)
    fill(shard, "r1", 2, prefix=b"new")  # r1 at 7 as well; r2 does not hear (partitioned)
    shard.heal()
    shard.run_for(2.5)  # r1's idle beacon (within 2 x BEACON_S): SEQAT 7 with its checksum
    assert shard.controlets["r2"].copy["snapshots"] == 2
    assert shard.converged() and b"old0" not in shard.data["r2"]


def _chain_pair() -> tuple[ChainReplication, ChainReplication]:
    """A middle r1 with 3 writes and a tail r2 that applied 1, as after a start together."""
    middle = ChainReplication("r1", ["r0", "r1", "r2"], 1, FAST, incarnation=1)
    tail = ChainReplication("r2", ["r0", "r1", "r2"], 1, FAST, incarnation=2)
    for c in (middle, tail):
        c.history.restart(0, 7)
    for seq in (1, 2, 3):
        middle.on_peer("r0", b"CHAIN", (b"%d" % seq, b"P", b"k%d" % seq, b"v"))
    tail.on_peer("r1", b"CHAIN", (b"1", b"P", b"k1", b"v"))
    tail.on_peer("r1", b"CHAIN", (b"3", b"P", b"k3", b"v"))  # a gap: WAITING, SYNCREQ with its position
    return middle, tail


def test_the_tail_protocol_end_to_end_and_its_checks() -> None:
    middle, tail = _chain_pair()
    assert tail.mode == "waiting"
    token, at, chain = tail.token, tail.applied, tail.history.chain
    answer = middle.on_peer("r2", b"SYNCREQ", (b"%d" % token, b"%d" % at, b"%d" % chain))
    kinds = [a.kind for a in answer]
    assert kinds == [b"LOGBEGIN", b"LOGDATA", b"LOGDATA", b"LOGEND"]
    wire = [(a.kind, tuple(f if isinstance(f, bytes) else str(f).encode() for f in a.fields)) for a in answer]
    # a forged LOGBEGIN (a replica that is not the source) and a stale token change nothing
    assert tail.on_peer("r0", b"LOGBEGIN", wire[0][1]) == [] and tail.mode == "waiting"
    stale = (b"%d" % (token - 1), *wire[0][1][1:])
    assert tail.on_peer("r1", b"LOGBEGIN", stale) == [] and tail.mode == "waiting"
    applied = []
    for kind, fields in wire:
        applied += tail.on_peer("r1", kind, fields)
    assert tail.ready and tail.applied == 3 and tail.history.chain == middle.history.chain
    assert [a.key for a in applied if hasattr(a, "key")] == [b"k2", b"k3"]
    assert tail.on_peer("r1", b"LOGDATA", wire[1][1]) == []  # a replay after the end: ignored


def test_a_tail_that_does_not_lead_to_the_source_state_becomes_a_snapshot() -> None:
    middle, tail = _chain_pair()
    token = b"%d" % tail.token
    tail.on_peer("r1", b"LOGBEGIN", (token, b"1"))
    tail.on_peer("r1", b"LOGDATA", (token, b"2", b"P", b"k2", b"FORGED"))
    tail.on_peer("r1", b"LOGDATA", (token, b"3", b"P", b"k3", b"v"))
    out = tail.on_peer("r1", b"LOGEND", (token, b"3", b"%d" % middle.history.chain))
    assert not tail.ready and tail.history.chain is None  # checksum mismatch: whole snapshot next
    assert [a.kind for a in out if hasattr(a, "kind")][-1] == b"SYNCREQ"
    request = next(a for a in out if getattr(a, "kind", None) == b"SYNCREQ")
    assert len(request.fields) == 1  # no position: the source answers with a snapshot
    assert isinstance(middle.on_peer("r2", b"SYNCREQ", request.fields)[-1], Snapshot)


def test_history_bounds_and_positions() -> None:
    h = StreamHistory(limit_bytes=3 * (64 + 3))
    h.restart(10, 99)
    for seq in range(11, 16):
        h.record(seq, (seq, b"P", b"k", b"v"))
    assert [e[0] for e in h.entries] == [13, 14, 15] and h.base == 12
    assert h.tail_after(11, 0) is None  # evicted
    assert h.tail_after(16, 0) is None  # ahead of this history
    assert h.tail_after(12, h.base_chain) == [(13, b"P", b"k", b"v"), (14, b"P", b"k", b"v"), (15, b"P", b"k", b"v")]
    assert h.tail_after(14, h.entries[1][2]) == [(15, b"P", b"k", b"v")]
    assert h.tail_after(14, 12345) is None  # another history
    h.record(17, (17, b"P", b"k", b"v"))  # not the next number: the history is unknown from here
    assert h.chain is None and h.position(17) == ()


def test_a_learner_copies_then_joins_and_takes_only_the_tail() -> None:
    shard = SimShard("ms-sc", replicas=3, seed=25, options=FAST)
    start_together(shard)
    fill(shard, "r0", 100)
    shard.crash("r2")
    shard.reconfigure(["r0", "r1"])  # failed over
    fill(shard, "r0", 10, prefix=b"a")
    # r2 comes back as a new process outside the map: a learner copying from the tail first
    shard.down.discard("r2")
    shard.incarnations["r2"] += 1
    learner = shard.controlets["r2"] = Learner("r2", ["r0", "r1"], ["r1", "r0"], shard.epoch, FAST,
                                                incarnation=shard.incarnations["r2"])
    shard._execute("r2", learner.on_start())
    shard.run_for(0.5)
    assert learner.copied and not learner.ready and learner.sync_source == "r1"
    assert str(settle(shard, shard.submit("r2", "get", b"k1"))).startswith("TRYAGAIN")
    copied_at = learner.applied
    assert shard.data["r2"] == shard.data["r1"]
    fill(shard, "r0", 5, prefix=b"b")  # the copy is stale by the time it joins
    shard.reconfigure(["r0", "r1", "r2"])
    shard.run_for(0.5)
    joined = shard.controlets["r2"]
    assert joined.ready and joined.applied == copied_at + 5
    assert joined.copy["snapshots"] == 1 and joined.copy["tails"] == 1 and joined.tail_entries == 5
    assert joined.learner_copy_s >= 0 and joined.state()["join_catch_up_s"] >= 0
    assert settle(shard, shard.submit("r0", "put", b"c", b"z")) == "OK"  # acknowledged by the new tail
    assert settle(shard, shard.submit("r2", "get", b"b4")) == VALUE
    shard.run_for(0.3)
    assert shard.converged() and shard.duplicate_completions == 0


def test_a_promoted_master_behind_a_survivor_copies_only_the_tail() -> None:
    """ms-ec POLLING: r1 missed two writes; promoted, it polls r2 (ahead) and takes the tail from it."""
    shard = SimShard("ms-ec", replicas=3, seed=26, options=FAST)
    start_together(shard)
    fill(shard, "r0", 50)
    shard.run_for(0.2)
    shard.partition("r0", "r1")
    fill(shard, "r0", 2, prefix=b"late")
    shard.run_for(0.2)
    shard.crash("r0")
    shard.heal()
    shard.reconfigure(["r1", "r2"])
    shard.run_for(0.5)
    master = shard.controlets["r1"]
    assert master.ready and master.applied == 52
    assert master.copy["tails"] == 1 and master.tail_entries == 2 and master.copy["snapshots"] == 1
    assert shard.data["r1"][b"late1"] == VALUE and shard.converged()


def test_a_lagging_replica_after_a_live_switch_takes_the_tail() -> None:
    """ms-ec -> ms-sc: a slave two writes behind waits in CONFIRMING, then copies only the tail."""
    shard = SimShard("ms-ec", replicas=3, seed=27, options=FAST)
    start_together(shard)
    fill(shard, "r0", 50)
    shard.run_for(0.2)
    shard.partition("r0", "r2")
    fill(shard, "r0", 2, prefix=b"late")
    shard.heal()
    shard.switch("ms-sc")
    shard.run_for(1.0)
    tail = shard.controlets["r2"]
    assert tail.ready and tail.copy["tails"] == 1 and tail.tail_entries == 2 and tail.copy["snapshots"] == 1
    assert settle(shard, shard.submit("r0", "put", b"after", b"y")) == "OK"
    assert settle(shard, shard.submit("r2", "get", b"late1")) == VALUE
    assert shard.converged()


def test_a_learner_that_copied_from_a_master_later_lost_is_corrected_by_a_snapshot() -> None:
    """ms-ec: the learner copies r0's writes that r1 never got; r0 dies, r1 (behind) is promoted;
    after the join the learner is ahead of its new master: a whole snapshot, not a tail."""
    shard = SimShard("ms-ec", replicas=3, seed=28, options=FAST)
    start_together(shard)
    fill(shard, "r0", 20)
    shard.run_for(0.2)
    shard.crash("r2")
    shard.reconfigure(["r0", "r1"])
    shard.partition("r0", "r1")
    fill(shard, "r0", 2, prefix=b"lost")  # acknowledged by the master only (asynchronous)
    shard.down.discard("r2")
    shard.incarnations["r2"] += 1
    learner = shard.controlets["r2"] = Learner("r2", ["r0", "r1"], ["r0", "r1"], shard.epoch, FAST,
                                                incarnation=shard.incarnations["r2"])
    shard._execute("r2", learner.on_start())
    shard.run_for(0.5)
    assert learner.copied and learner.sync_source == "r0" and b"lost1" in shard.data["r2"]
    shard.crash("r0")
    shard.heal()
    shard.reconfigure(["r1"])  # r1 promoted, two writes behind what the learner copied
    shard.run_for(0.3)
    shard.reconfigure(["r1", "r2"])
    shard.run_for(0.5)
    joined = shard.controlets["r2"]
    assert joined.ready and joined.copy["snapshots"] == 2 and joined.copy["tails"] == 0
    assert b"lost1" not in shard.data["r2"] and shard.converged()


@pytest.mark.parametrize("before,after", [("ms-ec", "aa-sc"), ("aa-sc", "ms-ec"), ("aa-sc", "ms-sc")])
def test_a_live_switch_between_ms_and_aa_never_serves_the_old_log_as_a_tail(before: str, after: str) -> None:
    """aa-sc's log entries carry the origin and request id, ms-sc's and ms-ec's do not: a replica behind
    at such a switch must copy a snapshot, not a tail it would misapply (seen: ms-ec -> aa-sc under
    load crashed the lagging replica's message handler; the other way it would write wrong keys)."""
    shard = SimShard(before, replicas=3, seed=5, options=FAST)
    start_together(shard)
    fill(shard, "r0", 20)
    shard.run_for(0.2)
    shard.partition("r0", "r2")  # r2 misses the next writes (under aa-sc they time out: outcome unknown)
    for i in range(2):
        settle(shard, shard.submit("r0", "put", b"late%d" % i, b"late"))
    shard.heal()
    shard.switch(after)
    shard.run_for(3.0)
    assert all(shard.controlets[n].ready for n in shard.members)
    assert shard.controlets["r2"].copy["tails"] == 0 and shard.controlets["r2"].copy["snapshots"] >= 1
    assert shard.converged()
    assert [shard.values(n).get(b"late1") for n in shard.members] == [b"late"] * 3
