"""A learner: a node outside the shard map copying its home shard's state before it joins.

Copy-then-join (node/agent.py): a node that finds itself absent from the map (a replacement, a
node back after its failover) first copies a whole snapshot from a live replica of its home shard
as a non-member, and asks the coordinator to join only once it holds that snapshot. It serves no
client meanwhile, and answers no catch-up request (it is nobody's source). What it keeps is the
snapshot's position p and the stream checksum there (streamlog.py); after the join, the new
map's controlet takes over from the learner (stream.py take_over) in mode COPIED, which is not
ready, so it asks its new upstream at once for what came after p: the log tail, not a snapshot
(its request, stamped with the new epoch, also makes an upstream that has not seen the new map yet
fetch it).

Why that is exact even though the snapshot is stale by the time the node joins: positions number
one stream, and the post-join catch-up replays every message after p (or copies a whole snapshot
when the upstream's log no longer reaches back to p, or its history at p differs). A learner
snapshot taken from a replica later found behind (ms-ec: the master fails and a replica that is
behind is promoted) is corrected the same way: the requester is then ahead of, or on another
history than, its new upstream, and the chain checksum makes that a whole snapshot.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mlsyskit.tools.kv.controlets.base import TRYAGAIN, Action, Fail, Send
from mlsyskit.tools.kv.controlets.stream import SYNC_KINDS, OrderedStream

LEARNING = f"{TRYAGAIN} this node is copying its shard's state before it joins; retry"
COPIED = "copied"  # holds a whole snapshot as of self.applied; waits for the join


class Learner(OrderedStream):
    """Copies a snapshot from `sources` (members of the shard, most preferred first); never a member."""

    name = "learner"
    topology = "-"
    consistency = "-"
    STREAM = b""
    POLL_ON_PROMOTION = False
    learner = True

    def __init__(self, node_id: str, members: Sequence[str], sources: Sequence[str], epoch: int,
                 options: Any = None, incarnation: int = 0) -> None:
        if node_id in members:
            raise ValueError(f"{node_id!r} is a member of {list(members)}: it joins by take_over, not as a learner")
        # Listed last, where it will join; index > 0, so it never declares itself ready with what it holds.
        super().__init__(node_id, (*members, node_id), epoch, options, incarnation)
        self.members = tuple(members)
        self.sources = tuple(s for s in sources if s in self.members)

    @staticmethod
    def write_targets(replicas: Sequence[str]) -> Sequence[str]:
        return ()

    @staticmethod
    def read_targets(replicas: Sequence[str]) -> Sequence[str]:
        return ()

    @property
    def upstream(self) -> str | None:
        return None  # it applies no stream: every live message is for members only

    def downstream(self) -> Sequence[str]:
        return ()

    def sync_sources(self) -> Sequence[str]:
        return self.sources

    @property
    def ready(self) -> bool:
        return False  # never serves: it is not in the map

    @property
    def copied(self) -> bool:
        """Holds a whole snapshot of the shard as of self.applied: it may ask to join."""
        return self.mode is COPIED

    def on_synced(self) -> list[Action]:
        self.mode = COPIED  # never ready: a member's controlet takes over and catches up from here
        return []

    def on_start(self) -> list[Action]:
        self.history.forget(self.applied)  # whatever the datalet holds: copy the whole snapshot
        return self.begin_sync()

    def apply_stream(self, src: str, seq: int, fields: Sequence[Any]) -> list[Action]:
        return []

    def fail_pending(self, message: str) -> list[Action]:
        return []

    def on_client(self, req: Any) -> list[Action]:
        return [Fail(req, LEARNING)]

    def on_peer(self, src: str, kind: bytes, fields: Sequence[Any]) -> list[Action]:
        if kind == b"SYNCREQ":
            return [Send(src, b"SYNCBUSY", (fields[0],))]  # not a source for anyone
        if kind in SYNC_KINDS and kind not in (b"POSQ", b"SEQAT"):
            return self.on_sync_message(src, kind, fields)
        return []

    def on_tick(self, now: float) -> list[Action]:
        self.now = now
        return [] if self.mode is COPIED else self.tick_sync(now)

    def state(self) -> dict[str, Any]:
        return {**super().state(), "role": "learner", "catching_up": 1, "copied": int(self.copied),
                "seq": self.applied}
