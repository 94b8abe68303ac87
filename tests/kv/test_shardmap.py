"""Hash slots and the shard map (slot math itself: test_cluster_slots.py)."""
from __future__ import annotations

import pytest

from mlsyskit.core.config import ConfigError
from mlsyskit.tools.kv.shardmap import ShardMap, hash64, layout


def test_hash_is_stable_blake2b() -> None:
    # A fixed value: Python's hash() would change per process (PYTHONHASHSEED); blake2b never does.
    assert hash64(b"user42") == int.from_bytes(__import__("hashlib").blake2b(b"user42", digest_size=8).digest(), "big")


def test_slot_ranges_balance_keys() -> None:
    smap = layout("ms-sc", "memory", 4, 1, "127.0.0.1", list(range(9000, 9004)))
    counts = [0] * 4
    for i in range(20_000):
        counts[smap.shard_for(b"key%d" % i)] += 1
    assert min(counts) > 0.9 * 5000 and max(counts) < 1.1 * 5000, counts


def test_shard_map_round_trip_and_roles() -> None:
    smap = layout("ms-sc", "memory", 2, 3, "127.0.0.1", list(range(9000, 9006)))
    again = ShardMap.from_json(smap.to_json())
    assert again.shards == (("s0r0", "s0r1", "s0r2"), ("s1r0", "s1r1", "s1r2"))
    assert again.nodes["s1r2"].port == 9005
    assert again.shard_of_node("s1r1") == 1 and again.shard_of_node("nope") is None
    assert all(again.shard_for(b"x%d" % i) == smap.shard_for(b"x%d" % i) for i in range(100))


def test_malformed_shard_maps_are_config_errors() -> None:
    with pytest.raises(ConfigError):
        ShardMap.from_dict({"epoch": 1})
    with pytest.raises(ConfigError, match="no address"):
        ShardMap.from_dict({"epoch": 1, "controlet": "ms-sc", "datalet": "memory", "shards": [["a"]], "nodes": {}})
    with pytest.raises(ConfigError):
        layout("ms-sc", "memory", 0, 1, "127.0.0.1", [])
