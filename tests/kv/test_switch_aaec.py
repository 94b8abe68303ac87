"""Live switches into and out of aa-ec on the deterministic simulator: entering aligns the replicas'
unversioned state before anyone serves, leaving gathers every replica's newer versions at the new
origin first. Each defence is also shown failing without it (the attacker: replicas that disagree
at the switch)."""
from __future__ import annotations

import pytest

from mlsyskit.tools.kv.check.simulate import SimShard
from mlsyskit.tools.kv.controlets import aa_ec_entry
from mlsyskit.tools.kv.redis import values

SEEDS = range(6)


def settle(shard: SimShard, seconds: float = 3.0) -> None:
    shard.run_for(seconds)


def ask(shard: SimShard, node: str, op: str, key: bytes, value: bytes | None = None):
    req = shard.submit(node, op, key, value)
    while not req.done:
        assert shard.loop.step(), "the network drained with the operation unanswered"
    return req.result


def read_everywhere(shard: SimShard, key: bytes) -> list:
    return [shard.values(n).get(key) for n in shard.members]


def lagging_ms_ec(seed: int, lagging: str = "r2") -> SimShard:
    """ms-ec where one replica missed the newest writes (cut off from the master while they were made)."""
    shard = SimShard("ms-ec", replicas=3, seed=seed)
    for i in range(5):
        assert ask(shard, "r0", "put", b"k%d" % i, b"old%d" % i) == "OK"
    settle(shard, 0.5)
    shard.partition("r0", lagging)
    for i in range(5):
        assert ask(shard, "r0", "put", b"k%d" % i, b"new%d" % i) == "OK"
    settle(shard, 0.2)
    assert shard.values(lagging)[b"k0"] == b"old0"  # the attacker's setting: replicas disagree at the switch
    return shard


@pytest.mark.parametrize("seed", SEEDS)
def test_entering_aa_ec_aligns_a_lagging_replica_before_it_serves(seed: int) -> None:
    shard = lagging_ms_ec(seed)
    shard.switch("aa-ec")
    assert not shard.controlets["r2"].ready  # r2 cannot reach replicas[0]: it serves nothing yet
    assert isinstance(ask(shard, "r2", "get", b"k0"), RuntimeError)
    settle(shard, 1.0)
    shard.heal()
    settle(shard)
    assert all(shard.controlets[n].ready for n in shard.members)
    assert shard.controlets["r2"].alignments == 1  # it copied replicas[0]'s state
    for i in range(5):
        assert read_everywhere(shard, b"k%d" % i) == [b"new%d" % i] * 3
    assert ask(shard, "r2", "put", b"k0", b"aa") == "OK"  # aa-ec writes anywhere, versioned above (0, 0)
    settle(shard)
    assert read_everywhere(shard, b"k0") == [b"aa"] * 3 and shard.converged()


def test_without_alignment_the_disagreement_is_never_repaired(monkeypatch) -> None:
    """The defence measured: if every replica served at once, equal versions (0, 0) with different values
    would stay different for ever: anti-entropy compares versions, not values."""
    def enter_unaligned(self, old):
        self.loading, self.align = True, aa_ec_entry.ALIGNED
        return []
    monkeypatch.setattr(aa_ec_entry.Entering, "enter_from_stream", enter_unaligned)
    shard = lagging_ms_ec(0)
    shard.switch("aa-ec")
    shard.heal()
    settle(shard, 5.0)
    assert read_everywhere(shard, b"k0") == [b"new0", b"new0", b"old0"]


@pytest.mark.parametrize("seed", SEEDS[:2])
@pytest.mark.parametrize("lagging", ["r1", "r2"])
@pytest.mark.parametrize("crash_after_s", [0.0, 0.004, 0.5])
def test_the_old_origin_failing_during_alignment_hands_it_on(seed: int, lagging: str, crash_after_s: float) -> None:
    """replicas[0] dies while the others align with it (before any answer, mid-way, after): the next
    replicas[0] (r1, lagging or not) polls the survivors and aligns the shard on the most advanced state."""
    shard = lagging_ms_ec(seed, lagging)
    shard.switch("aa-ec")
    settle(shard, crash_after_s)
    shard.crash("r0")
    shard.reconfigure(["r1", "r2"])
    shard.heal()
    settle(shard, 5.0)
    assert all(shard.controlets[n].ready for n in ("r1", "r2"))
    for i in range(5):  # the survivor that missed r0's newest writes copied the one that has them
        assert read_everywhere(shard, b"k%d" % i) == [b"new%d" % i] * 2
    assert shard.controlets[lagging].alignments == 1
    assert ask(shard, "r2", "put", b"k0", b"aa") == "OK"
    settle(shard)
    assert read_everywhere(shard, b"k0") == [b"aa"] * 2 and shard.converged()


def test_the_next_origin_waits_for_a_silent_replica_that_may_hold_the_reference_state() -> None:
    """The attacker: after a failover during alignment, the one replica that had aligned with the old
    origin is cut off from the next one, and the others it hears are behind. Deciding without it would
    align the shard on the older state while the silent replica keeps the newer one at the same version
    (0, 0), for ever; the next origin therefore waits for every replica in the map (a dead one leaves the
    map by failover)."""
    shard = SimShard("ms-ec", replicas=4, seed=3)
    for i in range(5):
        assert ask(shard, "r0", "put", b"k%d" % i, b"old%d" % i) == "OK"
    settle(shard, 0.5)
    shard.partition("r0", "r1")
    shard.partition("r0", "r2")
    for i in range(5):
        assert ask(shard, "r0", "put", b"k%d" % i, b"new%d" % i) == "OK"
    settle(shard, 0.2)
    shard.switch("aa-ec")
    settle(shard, 1.0)
    assert shard.controlets["r3"].ready and not shard.controlets["r1"].ready  # r3 aligned with r0: new state
    shard.crash("r0")
    shard.partition("r1", "r3")
    shard.reconfigure(["r1", "r2", "r3"])
    settle(shard, 5.0)  # well past 4 x sync_timeout
    assert not shard.controlets["r1"].ready  # it has not heard r3: it does not guess
    shard.heal()
    settle(shard, 5.0)
    assert all(shard.controlets[n].ready for n in shard.members)
    for i in range(5):
        assert read_everywhere(shard, b"k%d" % i) == [b"new%d" % i] * 3


def disagreeing_aa_ec(seed: int) -> tuple[SimShard, dict[bytes, bytes | None]]:
    """aa-ec where each replica holds acknowledged writes (and a delete) the others never received."""
    shard = SimShard("aa-ec", replicas=3, seed=seed)
    for i in range(4):
        assert ask(shard, "r1", "put", b"k%d" % i, b"base%d" % i) == "OK"
    settle(shard)
    for a in ("r0", "r1", "r2"):
        for b in ("r0", "r1", "r2"):
            if a < b:
                shard.partition(a, b)
    acked = {b"k0": b"at-r1", b"k1": b"at-r2", b"u0": b"only-r0", b"k2": None}
    assert ask(shard, "r1", "put", b"k0", b"at-r1") == "OK"
    assert ask(shard, "r2", "put", b"k1", b"at-r2") == "OK"
    assert ask(shard, "r0", "put", b"u0", b"only-r0") == "OK"
    assert ask(shard, "r2", "del", b"k2") == 1
    acked[b"k3"] = b"base3"
    shard.heal()  # healed, but nothing propagates again until anti-entropy: the switch comes first
    return shard, acked


@pytest.mark.parametrize("target", ["ms-sc", "ms-ec", "aa-sc"])
@pytest.mark.parametrize("seed", SEEDS[:3])
def test_leaving_aa_ec_keeps_every_replicas_acknowledged_writes(target: str, seed: int) -> None:
    shard, acked = disagreeing_aa_ec(seed)
    shard.switch(target)
    settle(shard)
    assert all(shard.controlets[n].ready for n in shard.members)
    for key, value in acked.items():
        assert read_everywhere(shard, key) == [value] * 3, key
    for node in shard.members:  # the tombstone is gone, not merely invisible
        assert b"k2" not in shard.data[node]
    target_node = shard.cls.read_targets(shard.members)[0]
    assert ask(shard, target_node, "get", b"u0") == b"only-r0"
    writer = shard.cls.write_targets(shard.members)[0]
    assert ask(shard, writer, "put", b"k0", b"after") == "OK"
    settle(shard)
    assert read_everywhere(shard, b"k0") == [b"after"] * 3 and shard.converged()


def test_without_gathering_a_replicas_acknowledged_write_is_lost(monkeypatch) -> None:
    """The defence measured: an origin that served at once, with the others copying it, drops the
    writes only the others held."""
    from mlsyskit.tools.kv.controlets import aa_ec_exit
    monkeypatch.setattr(aa_ec_exit.LeavingVersions, "_gather", lambda self: self._gathered())
    shard, acked = disagreeing_aa_ec(0)
    shard.switch("ms-sc")
    settle(shard)
    assert read_everywhere(shard, b"k1") != [b"at-r2"] * 3


def test_the_origin_failing_while_it_gathers_hands_the_gathering_on() -> None:
    shard, acked = disagreeing_aa_ec(1)
    shard.switch("ms-sc")
    shard.crash("r0")  # before any reply reached it; what only r0 held is lost, as in aa-ec's own failover
    shard.reconfigure(["r1", "r2"])
    settle(shard)
    assert all(shard.controlets[n].ready for n in ("r1", "r2"))
    for key in (b"k0", b"k1", b"k2", b"k3"):
        assert read_everywhere(shard, key) == [acked[key]] * 2, key


@pytest.mark.parametrize("seed", SEEDS[:3])
def test_a_round_trip_through_every_mode_keeps_every_write(seed: int) -> None:
    shard = SimShard("ms-sc", replicas=3, seed=seed)
    expected: dict[bytes, bytes | None] = {}
    n = 0
    for mode in ("aa-ec", "ms-ec", "aa-ec", "aa-sc", "aa-ec", "ms-sc"):
        for i in range(6):
            key, n = b"k%d" % (n % 5), n + 1
            node = shard.cls.write_targets(shard.members)[i % len(shard.cls.write_targets(shard.members))]
            if i == 5:
                assert ask(shard, node, "del", key) in (0, 1)
                expected[key] = None
            else:
                assert ask(shard, node, "put", key, b"v%d" % n) == "OK"
                expected[key] = b"v%d" % n
        settle(shard, 1.0)
        shard.switch(mode)
        settle(shard)
        assert all(shard.controlets[x].ready for x in shard.members), mode
    for key, value in expected.items():
        assert read_everywhere(shard, key) == [value] * 3, (key, seed)
    assert shard.converged()


def test_versioned_records_read_the_same_under_every_controlet() -> None:
    record = values.wrap_versioned(7, 1, values.stored_string(b"\x00BKVs looks like a record"))
    assert values.decode(record).data == b"\x00BKVs looks like a record"
    assert values.decode(values.wrap_versioned(9, 0, None)) is None
    assert values.unwrap_versioned(b"plain") == ((0, 0), b"plain")
    with pytest.raises(values.CorruptValue):
        values.decode(values.MAGIC + b"v\x00")


def test_equal_positions_on_another_history_are_not_taken_as_aligned() -> None:
    """After an ms-ec promotion renumbered, two replicas can stand at the same number with different
    data: the stream checksum tells them apart, so the other replica copies instead of confirming."""
    from tests.kv.test_logtail_sim import start_together
    shard = SimShard("ms-ec", replicas=3, seed=2)
    start_together(shard)
    for i in range(3):
        assert ask(shard, "r0", "put", b"k%d" % i, b"v%d" % i) == "OK"
    settle(shard, 0.5)
    r2 = shard.controlets["r2"]
    assert r2.applied == shard.controlets["r0"].applied
    shard.data["r2"][b"k0"] = b"another history"  # same number, other writes behind it
    r2.history.restart(r2.applied, 12345)
    shard.switch("aa-ec")
    settle(shard)
    assert shard.controlets["r1"].alignments == 0  # same number and checksum: confirmed, nothing copied
    assert shard.controlets["r2"].alignments == 1
    assert read_everywhere(shard, b"k0") == [b"v0"] * 3
