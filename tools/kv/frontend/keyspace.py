"""Commands over the whole keyspace: DBSIZE, KEYS, SCAN, answered across every shard.

The node that gets the command lists its own shard from its datalet and asks one read
replica of every other shard over its authenticated links (`BKV.KEYS pattern`, a peer-only
command), then merges. A node that redirects other shards' keys (`node.redirect`, as `bespokv
up`'s nodes do) is a Redis Cluster node, and answers for its own shard only, as Redis Cluster's
do: cluster clients send SCAN to every primary and merge (redis-py's scan_iter, go-redis,
Jedis), so a cluster-wide answer from each would list every key once per shard. Plain clients
get the whole keyspace from the proxy. Like Redis's own KEYS, the answer is a scan, not a snapshot: keys
written meanwhile may or may not appear. SCAN returns everything in one call with cursor 0
(Redis allows that; COUNT is a hint). FLUSHALL/FLUSHDB send one FLUSH per shard, ordered at
its write point like any write (chain head, master, sequencer), so every replica empties its
datalet at the same place in the shard's order; aa-ec refuses it.
"""
from __future__ import annotations

import asyncio
import fnmatch
from typing import TYPE_CHECKING

from mlsyskit.tools.kv.controlets.base import FLUSH
from mlsyskit.tools.kv.frontend.session import Session
from mlsyskit.tools.kv.node.requests import FLUSH_SHARD, Ready
from mlsyskit.tools.kv.redis import resp, values

if TYPE_CHECKING:
    from mlsyskit.tools.kv.node.runtime import Node


async def local_keys(node: Node, pattern: bytes, now_ms: int) -> list[bytes]:
    """This node's own visible keys matching a glob pattern (aa-ec tombstones and keys past
    their deadline are not keys)."""
    if node.datalet is None:
        return []
    pat = pattern.decode(errors="surrogateescape")
    everything = pattern == b"*"
    out = []
    async for key, raw in node.datalet.export_pairs():
        if node.visible is not None:
            raw = node.visible(raw)
            if raw is None:
                continue
        if raw[:1] == values.FIRST and values.expired(raw, now_ms):
            continue
        if everything or fnmatch.fnmatchcase(key.decode(errors="surrogateescape"), pat):
            out.append(key)
    return out


async def all_keys(node: Node, pattern: bytes, now_ms: int) -> list[bytes]:
    if node.redirect and node.shard is not None:  # a Redis Cluster node (not the proxy): its own shard
        return sorted(await local_keys(node, pattern, now_ms))
    calls = []
    for shard, replicas in enumerate(node.map.shards):
        if shard == node.shard:
            calls.append(local_keys(node, pattern, now_ms))
        else:
            target = node.controlet_cls.read_targets(replicas)[0]
            calls.append(node.link(target).call_frame(resp_command(b"BKV.KEYS", pattern)))
    parts = await asyncio.gather(*calls)
    return sorted(k for part in parts for k in part)


def resp_command(*parts: bytes) -> bytes:
    return b"*%d\r\n" % len(parts) + b"".join(resp.bulk(p) for p in parts)


def _later(conn: Session, work, encode) -> None:
    """Answer in order once `work` (a coroutine) finishes; an error becomes a RESP error."""
    slot = Ready(None)
    conn.slots.append(slot)

    async def run() -> None:
        try:
            slot.payload = encode(await work)
        except Exception as e:  # noqa: BLE001 - an unreachable shard is an answer, not a crash
            slot.payload = resp.error(f"TRYAGAIN a shard did not answer: {e}")
        conn.slot_done()

    task = asyncio.get_running_loop().create_task(run())
    conn.node.tasks.add(task)
    task.add_done_callback(conn.node.tasks.discard)


def cmd_dbsize(conn: Session, cmd: list) -> None:
    if len(cmd) != 1:
        return conn.reply(resp.error("wrong number of arguments for 'dbsize' command"))
    _later(conn, all_keys(conn.node, b"*", conn.unix_ms()), lambda keys: resp.integer(len(keys)))


def cmd_keys(conn: Session, cmd: list) -> None:
    if len(cmd) != 2:
        return conn.reply(resp.error("wrong number of arguments for 'keys' command"))
    _later(conn, all_keys(conn.node, cmd[1], conn.unix_ms()), resp.array)


def cmd_scan(conn: Session, cmd: list) -> None:
    if len(cmd) < 2 or len(cmd) % 2:
        return conn.reply(resp.error("wrong number of arguments for 'scan' command"))
    pattern = b"*"
    for option, value in zip(cmd[2::2], cmd[3::2], strict=True):
        if option.upper() == b"MATCH":
            pattern = value
        elif option.upper() != b"COUNT":
            return conn.reply(resp.error(f"SCAN option {option[:16].decode(errors='replace')} is not supported"))
    if cmd[1] != b"0":
        return conn.reply(resp.error("invalid cursor (bespokv answers a SCAN in one call, with cursor 0)"))
    _later(conn, all_keys(conn.node, pattern, conn.unix_ms()),
           lambda keys: b"*2\r\n" + resp.bulk(b"0") + resp.array(keys))


def cmd_peer_keys(conn: Session, cmd: list) -> None:
    """BKV.KEYS pattern: this node's own keys, for another node's DBSIZE/KEYS/SCAN (peers only:
    commands.INTERNAL)."""
    if len(cmd) != 2:
        return conn.reply(resp.error("wrong number of arguments for 'bkv.keys' command"))
    _later(conn, local_keys(conn.node, cmd[1], conn.unix_ms()), resp.array)


def cmd_flush(conn: Session, cmd: list) -> None:
    """FLUSHALL / FLUSHDB [ASYNC|SYNC]: one FLUSH per shard, answered once every shard acknowledged."""
    if len(cmd) > 2 or (len(cmd) == 2 and cmd[1].upper() not in (b"ASYNC", b"SYNC")):
        return conn.reply(resp.error("syntax error"))
    conn.multi(b"FLUSHALL", FLUSH, [(key, None) for key in shard_keys(conn.node)])


def cmd_flush_shard(conn: Session, cmd: list) -> None:
    """BKV.FLUSHSHARD key: FLUSHALL's part for the shard that owns `key` (other nodes only:
    commands.INTERNAL)."""
    if len(cmd) != 2:
        return conn.reply(resp.error("wrong number of arguments for 'bkv.flushshard' command"))
    conn.single(FLUSH, cmd[1], None)


def shard_keys(node: Node) -> list[bytes]:
    """One key per shard (found once by hashing candidates), so a FLUSH routes like a write."""
    keys = getattr(node, "_shard_keys", None)
    if keys is None:
        found: dict[int, bytes] = {}
        i = 0
        while len(found) < len(node.map.shards):
            key = b"bkv-flush-%d" % i
            found.setdefault(node.map.shard_for(key), key)
            i += 1
        keys = node._shard_keys = [found[s] for s in range(len(node.map.shards))]
    return keys


HANDLERS = {b"DBSIZE": cmd_dbsize, b"KEYS": cmd_keys, b"SCAN": cmd_scan, b"BKV.KEYS": cmd_peer_keys,
            b"FLUSHALL": cmd_flush, b"FLUSHDB": cmd_flush, FLUSH_SHARD: cmd_flush_shard}
