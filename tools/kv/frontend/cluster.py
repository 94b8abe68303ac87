"""Redis Cluster's view of a bespokv cluster: CLUSTER SLOTS/SHARDS/NODES/INFO/KEYSLOT/MYID and
READONLY/READWRITE/ASKING, so that cluster clients (redis-py's RedisCluster, redis-cli -c) work
unchanged against the nodes.

Each shard owns slot ranges (kv/shardmap.py: CRC16 mod 16384 with {hash tags}); its "master" is
its controlet's write point (the chain head, the ms-ec master, the first replica of an
active-active shard) and its "replicas" the others, in role order. A node answers -MOVED for a
key of another shard (node/requests.moved); bespokv never migrates slots, so -ASK never arises
and ASKING is accepted and changes nothing.

Failover: a master killed -9 refuses connections at once, but the coordinator replaces it only
after the failure timeout (<= 5 s). Meanwhile a client that lost its connection asks a live node
for CLUSTER SLOTS: the node tries to connect to each master it would name (0.25 s at most, in
parallel) and names, for a master whose port refuses, the next replica instead. That replica is
alive and holds what it is sent until the new map says who the write point is (node/ridethrough.py),
so the client's retry lands on a node that rides through the failover instead of on a closed port.
Only a refused connection counts: a slow or stopped master is still named (the node cannot tell
it from a busy one).
"""
from __future__ import annotations

import asyncio
import hashlib
from typing import Any

from mlsyskit.tools.kv.frontend import admin
from mlsyskit.tools.kv.frontend.session import Session
from mlsyskit.tools.kv.node.requests import Ready, shard_order
from mlsyskit.tools.kv.redis import resp
from mlsyskit.tools.kv.shardmap import SLOTS, ShardMap, key_slot

PROBE_S = 0.25


def hex_id(node_id: str) -> str:
    """A node's 40-hex-digit cluster id (Redis's form), stable across restarts: sha1 of its name."""
    return hashlib.sha1(node_id.encode()).hexdigest()


def encode(x: Any, protocol: int = 2) -> bytes:
    """Nested lists, dicts (RESP3 maps; flat pairs in RESP2), ints and strings as RESP."""
    if isinstance(x, int):
        return resp.integer(x)
    if isinstance(x, str):
        return resp.bulk(x.encode())
    if isinstance(x, bytes):
        return resp.bulk(x)
    if isinstance(x, dict):
        if protocol == 3:
            return b"%%%d\r\n" % len(x) + b"".join(encode(k, 3) + encode(v, 3) for k, v in x.items())
        x = [item for pair in x.items() for item in pair]
    return b"*%d\r\n" % len(x) + b"".join(encode(item, protocol) for item in x)


def roles(smap: ShardMap, controlet_cls: Any, down: frozenset[str] = frozenset()) -> list[list[str]]:
    """Per shard, its nodes master first: the write point, unless it is known down; then the rest,
    the ones known down last."""
    out = []
    for replicas in smap.shards:
        order = shard_order(controlet_cls, replicas)
        alive = [n for n in order if n not in down]
        master = alive[0] if alive else order[0]
        out.append([master] + [n for n in alive if n != master] + [n for n in order if n in down and n != master])
    return out


def slots_reply(smap: ShardMap, controlet_cls: Any, down: frozenset[str] = frozenset()) -> list:
    """CLUSTER SLOTS: [first, last, [host, port, id], replicas ...] per slot range."""
    table = []
    for shard, nodes in enumerate(roles(smap, controlet_cls, down)):
        entries = [[smap.nodes[n].host, smap.nodes[n].port, hex_id(n)] for n in nodes]
        table += [[first, last, *entries] for first, last in smap.slots[shard]]
    return table


def shards_reply(smap: ShardMap, controlet_cls: Any, down: frozenset[str] = frozenset()) -> list:
    """CLUSTER SHARDS (Redis 7): per shard its slots (flat first/last pairs) and its nodes."""
    out = []
    for shard, nodes in enumerate(roles(smap, controlet_cls, down)):
        flat = [bound for first, last in smap.slots[shard] for bound in (first, last)]
        described = [{"id": hex_id(n), "port": smap.nodes[n].port, "ip": smap.nodes[n].host,
                      "endpoint": smap.nodes[n].host, "role": "master" if i == 0 else "replica",
                      "replication-offset": 0, "health": "failed" if n in down else "online"}
                     for i, n in enumerate(nodes)]
        out.append({"slots": flat, "nodes": described})
    return out


def nodes_reply(smap: ShardMap, controlet_cls: Any, me: str | None, down: frozenset[str] = frozenset()) -> bytes:
    """CLUSTER NODES: one line per node in Redis's format."""
    lines = []
    for shard, nodes in enumerate(roles(smap, controlet_cls, down)):
        ranges = " ".join(f"{a}-{b}" if a != b else f"{a}" for a, b in smap.slots[shard])
        for i, n in enumerate(nodes):
            addr = smap.nodes[n]
            flags = ",".join([*(["myself"] if n == me else []), "master" if i == 0 else "slave",
                              *(["fail"] if n in down else [])])
            master = "-" if i == 0 else hex_id(nodes[0])
            tail = f" {ranges}" if i == 0 else ""
            lines.append(f"{hex_id(n)} {addr.host}:{addr.port}@{addr.port + 10000} {flags} {master} 0 0 "
                         f"{smap.epoch} connected{tail}")
    return ("\n".join(lines) + "\n").encode()


def info_reply(smap: ShardMap) -> bytes:
    fields = {"cluster_enabled": 1, "cluster_state": "ok", "cluster_slots_assigned": SLOTS,
              "cluster_slots_ok": SLOTS, "cluster_slots_pfail": 0, "cluster_slots_fail": 0,
              "cluster_known_nodes": len(smap.nodes), "cluster_size": len(smap.shards),
              "cluster_current_epoch": smap.epoch, "cluster_my_epoch": smap.epoch}
    return "".join(f"{k}:{v}\r\n" for k, v in fields.items()).encode()


async def refusing(host: str, port: int, timeout: float = PROBE_S) -> bool:
    """True only when host:port refuses a TCP connection (nothing listens: the process is gone)."""
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    except ConnectionRefusedError:
        return True
    except (OSError, TimeoutError):
        return False
    writer.close()
    return False


async def masters_down(node: Any) -> frozenset[str]:
    """The shards' write points (other than this node) whose port refuses connections now."""
    smap = node.map
    masters = [shard_order(node.controlet_cls, r)[0] for r in smap.shards]
    masters = [m for m in masters if m != node.node_id]
    found = await asyncio.gather(*(refusing(smap.nodes[m].host, smap.nodes[m].port) for m in masters))
    return frozenset(m for m, refused in zip(masters, found, strict=True) if refused)


def _later(conn: Session, build: Any) -> None:
    """Answer in order once the masters were probed: build(down) gives the reply."""
    slot = Ready(None)
    conn.slots.append(slot)

    async def probe() -> None:
        try:
            down = await masters_down(conn.node)
        except Exception:  # noqa: BLE001 - a failed probe must not lose the reply: name the map's masters
            down = frozenset()
        slot.payload = build(down)
        conn.slot_done()

    conn.node.spawn(probe())


def cmd_cluster(conn: Session, cmd: list) -> None:
    sub = cmd[1].upper() if len(cmd) > 1 else b""
    node, smap = conn.node, conn.node.map
    cls, proto = node.controlet_cls, conn.protocol
    if sub == b"SLOTS" and len(cmd) == 2:
        return _later(conn, lambda down: encode(slots_reply(smap, cls, down), proto))
    if sub == b"SHARDS" and len(cmd) == 2:
        return _later(conn, lambda down: encode(shards_reply(smap, cls, down), proto))
    if sub == b"NODES" and len(cmd) == 2:
        return _later(conn, lambda down: resp.bulk(nodes_reply(smap, cls, node.node_id, down)))
    if sub == b"INFO" and len(cmd) == 2:
        return conn.reply(resp.bulk(info_reply(smap)))
    if sub == b"MYID" and len(cmd) == 2:
        return conn.reply(resp.bulk(hex_id(node.node_id or "proxy").encode()))
    if sub == b"KEYSLOT" and len(cmd) == 3:
        return conn.reply(resp.integer(key_slot(cmd[2])))
    what = sub[:32].decode(errors="replace")
    conn.reply(resp.error(f"CLUSTER {what} is not supported by bespokv (SLOTS SHARDS NODES INFO MYID KEYSLOT are; "
                          "slots never migrate)"))


def cmd_ok(conn: Session, cmd: list) -> None:
    """READONLY / READWRITE / ASKING: every replica already serves what its controlet allows, and
    no slot is ever migrating, so these change nothing."""
    if len(cmd) != 1:
        return conn.reply(resp.error(f"wrong number of arguments for '{cmd[0].decode().lower()}' command"))
    conn.reply(resp.OK)


HANDLERS = {b"CLUSTER": cmd_cluster, b"READONLY": cmd_ok, b"READWRITE": cmd_ok, b"ASKING": cmd_ok}
admin.ARITY.update({b"CLUSTER": (-2, (), 0, 0, 0), b"READONLY": (1, (b"fast",), 0, 0, 0),
                    b"READWRITE": (1, (b"fast",), 0, 0, 0), b"ASKING": (1, (b"fast",), 0, 0, 0)})
