"""The controlets' promises, checked on the deterministic simulator over many seeded interleavings."""
from __future__ import annotations

import random

import pytest

from mlsyskit.tools.kv.check.simulate import SimShard
from mlsyskit.tools.kv.controlets import CONTROLETS, controlet_class, controlet_name

SEEDS = range(25)


def run_sequential_client(shard: SimShard, rng: random.Random, ops: int = 40) -> list[tuple]:
    """One client, one op at a time at random replicas: the next op starts the moment the previous
    one is answered, with replication messages still in flight (so a protocol that answers early
    is caught reading stale data)."""
    log = []
    for i in range(ops):
        key = b"k%d" % rng.randrange(4)
        node = rng.choice(shard.ids)
        if rng.random() < 0.5:
            req = shard.submit(node, "put", key, b"v%d" % i)
        else:
            req = shard.submit(node, "get", key)
        while not req.done:
            assert shard.loop.step(), "the network drained with the operation unanswered"
        log.append((req.op, key, req.value, req.result))
    return log


@pytest.mark.parametrize("name", ["ms-ec", "aa-ec"])
def test_eventual_controlets_do_serve_stale_reads(name: str) -> None:
    """The same client on an eventual controlet sees stale data sometimes: the check has teeth."""
    stale = 0
    for seed in SEEDS:
        rng = random.Random(seed)
        shard = SimShard(name, replicas=3, seed=seed)
        last: dict[bytes, bytes] = {}
        for op, key, value, result in run_sequential_client(shard, rng):
            if op == "put":
                last[key] = value
            elif result != last.get(key):
                stale += 1
    assert stale > 0


@pytest.mark.parametrize("name", ["ms-sc", "aa-sc"])
def test_strong_controlets_read_the_last_acknowledged_write(name: str) -> None:
    for seed in SEEDS:
        rng = random.Random(seed)
        shard = SimShard(name, replicas=3, seed=seed)
        last: dict[bytes, bytes] = {}
        for op, key, value, result in run_sequential_client(shard, rng):
            if op == "put":
                last[key] = value
            else:
                assert result == last.get(key), f"seed {seed}: stale read of {key!r}"
        shard.run()
        assert shard.converged()
        assert shard.history.pending() == 0


@pytest.mark.parametrize("name", sorted(CONTROLETS))
def test_concurrent_writers_converge(name: str) -> None:
    """Writers at every replica race on the same keys; once messages drain, replicas agree."""
    for seed in SEEDS:
        rng = random.Random(1000 + seed)
        shard = SimShard(name, replicas=3, seed=seed, max_delay=5e-3)
        reqs = []
        for i in range(60):
            node = rng.choice(shard.ids)
            key = b"hot%d" % rng.randrange(3)
            op = "del" if rng.random() < 0.15 else "put"
            reqs.append(shard.submit(node, op, key, b"w%d" % i if op == "put" else None,
                                     process=i, delay=rng.uniform(0, 0.01)))
        shard.run()
        assert all(r.done for r in reqs)
        assert shard.converged(), f"{name} seed {seed}: {shard.data}"


def test_chain_acknowledges_only_after_the_tail_applied() -> None:
    shard = SimShard("ms-sc", replicas=3, seed=7)
    req = shard.submit("r0", "put", b"x", b"1")
    while not req.done:
        assert shard.loop.step()
        if not req.done:
            continue
        assert shard.data["r2"].get(b"x") == b"1", "the head answered before the tail had the write"
    assert req.result == "OK"


def test_master_slave_eventual_answers_before_slaves_apply() -> None:
    shard = SimShard("ms-ec", replicas=3, seed=3, max_delay=1e-2)
    req = shard.submit("r0", "put", b"x", b"1")
    shard.loop.step()  # the client's arrival at the master
    assert req.done and req.result == "OK"
    assert b"x" not in shard.data["r1"] and b"x" not in shard.data["r2"], "slaves lag: eventual, not strong"
    shard.run()
    assert shard.converged()


def test_last_writer_wins_picks_the_greatest_version_in_any_delivery_order() -> None:
    finals = set()
    for seed in SEEDS:
        shard = SimShard("aa-ec", replicas=3, seed=seed, max_delay=1e-2)
        shard.submit("r0", "put", b"k", b"from-r0")
        shard.submit("r2", "put", b"k", b"from-r2")  # same Lamport counter: higher replica index wins
        shard.run()
        assert shard.converged()
        finals.add(shard.values("r0")[b"k"])
    assert finals == {b"from-r2"}


def test_delete_answers_whether_the_key_existed() -> None:
    for name in sorted(CONTROLETS):
        shard = SimShard(name, replicas=3, seed=1)
        shard.submit("r0", "put", b"k", b"v")
        shard.run()
        first, second = shard.submit("r0", "del", b"k"), None
        shard.run()
        second = shard.submit("r0", "del", b"k")
        shard.run()
        assert (first.result, second.result) == (1, 0), name


def test_registry_and_names() -> None:
    assert controlet_name("ms", "strong") == "ms-sc" and controlet_name("aa", "eventual") == "aa-ec"
    assert {controlet_class(n).topology for n in CONTROLETS} == {"ms", "aa"}
    with pytest.raises(Exception, match="unknown controlet"):
        controlet_class("paxos")
    with pytest.raises(Exception, match="topology must be"):
        controlet_name("ring", "strong")


def test_active_active_strong_has_no_new_old_inversion() -> None:
    """Reader A sees the new value at one replica; reader B, starting after A finished, must see it
    at another replica too (serving reads locally, without the sequencer, fails this)."""
    for seed in SEEDS:
        shard = SimShard("aa-sc", replicas=3, seed=seed, max_delay=1e-2)
        shard.submit("r0", "put", b"k", b"old")
        shard.run()
        shard.submit("r0", "put", b"k", b"new", process=1)
        a = shard.submit("r1", "get", b"k", process=2)
        while not (a.done and a.result == b"new"):
            assert shard.loop.step()
            if a.done and a.result != b"new":
                a = shard.submit("r1", "get", b"k", process=2, delay=1e-4)
        b = shard.submit("r2", "get", b"k", process=3)
        while not b.done:
            assert shard.loop.step()
        assert b.result == b"new", f"seed {seed}: new-old inversion"
