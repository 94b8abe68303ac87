"""Key expiry: lazy on every read, plus an active sweep that deletes through the write path.

Reads never delete: a replica answers a key past its deadline as absent (values.live) and
leaves the bytes alone, so no replica ever changes its data on its own. Deleting is the
sweep's job, and the sweep runs only at the shard's write point (chain head, master,
sequencer): every `interval` it takes the keys whose deadline passed and submits, for
each, a `BKV.REAP key` read-modify-write -- resolved where the shard's writes are ordered,
it deletes the key only if it is still expired there, and the controlet replicates that
DEL like any write. So head and tail hold the same keys at the same place in the shard's
order, and a key that was rewritten meanwhile (SET, PERSIST) survives.

The write point learns deadlines from the writes it resolves (`note`) and, when it becomes
the write point (start, failover), from one scan of its datalet. Clock: deadlines are Unix
milliseconds (`wall_ms`, injected); replicas compare them to their own wall clock, so
replicas whose clocks differ by e bound a read's view of the expiry instant by e.
"""
from __future__ import annotations

import asyncio
import heapq
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from mlsyskit.tools.kv.controlets.base import RMW
from mlsyskit.tools.kv.node.requests import Request
from mlsyskit.tools.kv.redis import values
from mlsyskit.tools.kv.redis.rmw import REAP, Command

if TYPE_CHECKING:
    from mlsyskit.tools.kv.node.runtime import Node


def wall_ms() -> int:
    """Unix time in milliseconds: what deadlines (EXPIREAT, SET PXAT, replicated records) use."""
    return time.time_ns() // 1_000_000


class ActiveExpiry:
    """One node's sweep (it works only while the node is its shard's write point)."""

    def __init__(self, node: Node, unix_ms: Callable[[], int] = wall_ms, interval: float = 0.1,
                 batch: int = 256, retry_ms: int = 1000) -> None:
        self.node = node
        self.unix_ms = unix_ms
        self.interval, self.batch, self.retry_ms = interval, batch, retry_ms
        self.due: list[tuple[int, bytes]] = []  # (deadline, key): a heap; entries not in `noted` are stale
        self.noted: dict[bytes, int] = {}  # each key's latest deadline: bounds the heap (compacted)
        self.reaping: set[bytes] = set()
        self.scanned = False  # this write point has seen every deadline in its datalet
        self.reaped = 0

    def note(self, key: bytes, deadline: int) -> None:
        if not deadline or self.noted.get(key) == deadline:
            return
        self.noted[key] = deadline
        heapq.heappush(self.due, (deadline, key))
        if len(self.due) > 2 * len(self.noted) + 1024:  # many re-noted keys (EXPIRE in a loop): compact
            self.due = [(d, k) for k, d in self.noted.items()]
            heapq.heapify(self.due)

    def is_write_point(self) -> bool:
        node = self.node
        return (node.controlet is not None and node.datalet is not None and node.ready
                and node.map.shards[node.shard][0] == node.node_id)

    async def run(self) -> None:
        while True:
            await self.node.clock.asleep(self.interval)
            if not self.is_write_point():
                self.scanned = False  # a later promotion rescans: deadlines came by replication
                continue
            if not self.scanned:
                await self.rescan()
            self.sweep()

    async def rescan(self) -> None:
        self.due.clear()
        self.noted.clear()
        async for key, stored in self.node.datalet.export_pairs():
            if stored[:1] == values.FIRST:
                self.note(key, values.deadline_of(stored))
        self.scanned = True

    def sweep(self) -> int:
        """Submit a REAP for each key past its deadline (at most `batch`); returns how many."""
        now = self.unix_ms()
        read = self.node.controlet.read_local  # a local datalet: skip keys rewritten meanwhile
        submitted = 0
        while self.due and self.due[0][0] <= now and submitted < self.batch:
            deadline, key = heapq.heappop(self.due)
            if self.noted.get(key) != deadline:
                continue  # superseded by a later note
            del self.noted[key]
            if key in self.reaping:
                continue
            if read is not None:
                stored = read(key)
                if not values.expired(stored, now):
                    self.note(key, values.deadline_of(stored))  # a later deadline: keep watching
                    continue
            self.reaping.add(key)
            req = Request(RMW, key, None, self)
            req.rmw = Command([REAP, key], now)
            self.node.submit(req)
            submitted += 1
        return submitted

    # -- the connection side of a REAP request ----------------------------------------------------
    def slot_done(self, req: Request) -> None:
        self.reaping.discard(req.key)
        if req.payload[:1] == b"-":  # not applied (catching up, timeout): try again later
            self.note(req.key, self.unix_ms() + self.retry_ms)
        else:
            self.reaped += 1


def start(node: Node, unix_ms: Callable[[], int] = wall_ms) -> ActiveExpiry:
    """The node's sweep as a task in node.tasks (Node.stop cancels it)."""
    expiry = ActiveExpiry(node, unix_ms)
    if node.controlet is not None and node.datalet is not None:
        task = asyncio.get_running_loop().create_task(expiry.run())
        node.tasks.add(task)
        task.add_done_callback(node.tasks.discard)
    return expiry
