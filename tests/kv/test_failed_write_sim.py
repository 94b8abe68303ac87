"""A write answered with an error leaves no trace on any replica (issue 22, item 2), on the
deterministic simulator with a memory datalet that fails writes on command (faulty_datalet.py).

ms-sc and aa-sc answer a write once every replica applied it, so an error on any replica fails it
and it is taken back everywhere (controlets/undo.py). ms-ec and aa-ec answer once the first
replica applied it: an error there fails it and nothing is sent; an error on a later replica
cannot fail an acknowledged write, which then reaches that replica by catch-up or repair.
"""
from __future__ import annotations

import pytest

from mlsyskit.tools.kv.check.simulate import SimShard, SimTransport
from mlsyskit.tools.kv.controlets.base import ControletOptions
from mlsyskit.tools.kv.datalets.memory import MemoryDatalet
from mlsyskit.tools.kv.node.interpreter import Interpreter
from mlsyskit.tools.kv.redis import values
from tests.kv.faulty_datalet import FaultyDatalet

FAST = ControletOptions(write_timeout=0.5, sync_timeout=0.1, anti_entropy_interval=0.1)
settle = SimShard.answer
SEEDS = [1, 2, 3]


def faulty_shard(name: str, seed: int) -> tuple[SimShard, dict[str, set[bytes]]]:
    """A 3-replica shard whose replicas fail writes of the keys in `armed[replica]`."""
    shard = SimShard(name, replicas=3, seed=seed, options=FAST)
    armed: dict[str, set[bytes]] = {n: set() for n in shard.ids}
    for n in shard.ids:
        shard.datalets[n] = FaultyDatalet(MemoryDatalet(), lambda key, n=n: key in armed[n])
        shard.interpreters[n] = Interpreter(shard.datalets[n], SimTransport(shard, n), shard.stats)
    return shard, armed


def value(stored: bytes) -> bytes:
    return values.decode(stored).data  # aa-ec keeps a version with the value


def is_error(result) -> bool:
    return isinstance(result, Exception)


@pytest.mark.parametrize("name,writer", [("ms-sc", "r0"), ("aa-sc", "r0"), ("aa-sc", "r2")])
@pytest.mark.parametrize("bad", ["r0", "r1", "r2"])
def test_a_strong_write_that_fails_on_any_replica_fails_everywhere(name: str, writer: str, bad: str) -> None:
    shard, armed = faulty_shard(name, seed=7)
    assert settle(shard, shard.submit(writer, "put", b"k", b"old")) == "OK"
    armed[bad].add(b"k")
    failed = shard.submit(writer, "put", b"k", b"new")
    later = [shard.submit(writer, "put", b"other%d" % i, b"v", delay=0.0001 * i) for i in range(3)]
    result = settle(shard, failed)
    assert is_error(result) and "OOM" in str(result) and not str(result).startswith("TRYAGAIN"), result
    for req in later:  # ordered after the failed write: applied everywhere, or failed and nowhere
        settle(shard, req)
    armed[bad].clear()
    shard.run_for(1.0)
    assert shard.converged(), shard.data
    for n in shard.ids:
        assert shard.data[n][b"k"] == b"old", (n, shard.data[n])
        for i, req in enumerate(later):
            assert (b"other%d" % i in shard.data[n]) == (req.result == "OK"), (n, i, req.result)
    assert settle(shard, shard.submit(writer, "get", b"k")) == b"old"
    assert settle(shard, shard.submit(writer, "put", b"k", b"after")) == "OK"  # the shard writes again
    shard.run_for(0.5)
    assert shard.converged() and all(shard.data[n][b"k"] == b"after" for n in shard.ids)
    assert shard.duplicate_completions == 0


@pytest.mark.parametrize("name", ["ms-sc", "aa-sc"])
def test_a_replica_that_fails_every_write_fails_each_one_and_keeps_the_shard_consistent(name: str) -> None:
    """Redis at maxmemory on one replica: every write fails (no value appears anywhere), the
    shard serves again once the replica has memory."""
    shard, armed = faulty_shard(name, seed=3)
    for i in range(5):
        assert settle(shard, shard.submit("r0", "put", b"k%d" % i, b"v")) == "OK"
    armed["r1"].update(b"k%d" % i for i in range(10))
    results = [settle(shard, shard.submit("r0", "put", b"k%d" % (5 + i), b"w")) for i in range(5)]
    assert all(is_error(r) for r in results), results
    armed["r1"].clear()
    shard.run_for(1.0)
    assert shard.converged()
    assert all(sorted(shard.data[n]) == [b"k%d" % i for i in range(5)] for n in shard.ids), shard.data
    assert settle(shard, shard.submit("r0", "put", b"k7", b"x")) == "OK"


@pytest.mark.parametrize("name", ["ms-ec", "aa-ec"])
def test_an_eventual_write_failed_at_its_first_replica_is_nowhere(name: str) -> None:
    shard, armed = faulty_shard(name, seed=5)
    assert settle(shard, shard.submit("r0", "put", b"k", b"old")) == "OK"
    shard.run_for(0.5)
    armed["r0"].add(b"k")
    result = settle(shard, shard.submit("r0", "put", b"k", b"new"))
    assert is_error(result) and "OOM" in str(result)
    armed["r0"].clear()
    shard.run_for(1.0)
    assert shard.converged() and all(value(shard.data[n][b"k"]) == b"old" for n in shard.ids), shard.data


@pytest.mark.parametrize("name", ["ms-ec", "aa-ec"])
def test_an_eventual_write_acknowledged_then_failed_on_another_replica_reaches_it_later(name: str) -> None:
    shard, armed = faulty_shard(name, seed=6)
    assert settle(shard, shard.submit("r0", "put", b"k", b"old")) == "OK"
    shard.run_for(0.5)
    armed["r1"].add(b"k")
    assert settle(shard, shard.submit("r0", "put", b"k", b"new")) == "OK"
    shard.run_for(0.3)
    armed["r1"].clear()
    assert settle(shard, shard.submit("r0", "put", b"z", b"1")) == "OK"  # the next write shows the gap
    shard.run_for(2.0)
    assert shard.converged() and all(value(shard.data[n][b"k"]) == b"new" for n in shard.ids), shard.data


@pytest.mark.parametrize("name", ["ms-sc", "aa-sc", "ms-ec", "aa-ec"])
@pytest.mark.parametrize("seed", SEEDS)
def test_random_datalet_failures_under_concurrent_writes_never_show_a_failed_write(name: str, seed: int) -> None:
    """Writes and reads from every replica at once, each replica's datalet failing a random fifth of
    the time: no read ever returns a value whose write was answered with a (non-TRYAGAIN) error,
    and once the failures stop the replicas converge to values of writes that were not failed."""
    import random

    shard, _ = faulty_shard(name, seed=seed)
    rng = random.Random(seed)
    failing = {"on": True}
    for n in shard.ids:
        shard.datalets[n].fail = lambda key, r=random.Random(seed * 10 + int(n[1:])): failing["on"] and r.random() < 0.2
    writers = ["r0"] if name.startswith("ms") else shard.ids
    readers = ["r0"] if name == "ms-sc" else shard.ids
    writes, reads = [], []
    for i in range(150):
        key = b"k%d" % rng.randrange(4)
        if rng.random() < 0.7:
            writes.append(shard.submit(rng.choice(writers), "put", key, b"v%d" % i, process=i % 5,
                                       delay=rng.random() * 0.05))
        else:
            reads.append(shard.submit(rng.choice(readers), "get", key, process=i % 5, delay=rng.random() * 0.05))
    for req in writes + reads:
        settle(shard, req, limit=10.0)
    failed = {w.value for w in writes if is_error(w.result) and not str(w.result).startswith("TRYAGAIN")}
    assert failed, "no write failed: the test injected nothing"
    assert not [r.result for r in reads if r.result in failed]
    failing["on"] = False
    shard.run_for(2.0)
    assert settle(shard, shard.submit(writers[0], "put", b"final", b"x"), limit=5.0) == "OK"
    shard.run_for(1.0)
    assert shard.converged(), shard.data
    assert not [v for v in shard.data["r0"].values() if value(v) in failed]
    assert shard.duplicate_completions == 0
