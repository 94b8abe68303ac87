"""Catch-up for replicas that apply one numbered stream in order (ms-sc, ms-ec, aa-sc).

The stream's origin (chain head, master, sequencer) numbers its writes 1, 2, 3, ...; every
other replica applies them strictly in order. A replica that receives anything but the next
number has missed messages (a link gave up, it or its upstream restarted): it never skips.
It stops applying, asks a live replica for its whole state and resumes from there:

    receiver                          source (any ready replica of the shard)
    SYNCREQ token          ->
                           <-  SNAPBEGIN token seq     (SYNCBUSY token when not ready itself)
                           <-  SNAPDATA token k v ...  (the runtime streams its datalet)
                           <-  SNAPEND token seq

On SNAPBEGIN the receiver empties its datalet (Reset); after SNAPEND it holds the source's
state as of `seq`, plus the stream messages it buffered meanwhile (FIFO link: every stream
message after SNAPBEGIN is newer than `seq`). A local datalet exports its state at SNAPBEGIN, so one
replay is exact, deltas (rmw.DELTAS) too; a remote one only gets whole-value writes (idempotent).

A replica that (re)starts catches up the same way before it serves reads or acknowledges
writes (on_start). Sources are tried in preference order; one that answers SYNCBUSY or
nothing within sync_timeout is skipped. Only when every other replica explicitly answered
SYNCBUSY in one round (a whole shard starting together) does the first replica in role
order declare itself ready with what it holds; a silent replica (paused, partitioned) never
counts, so a restarted replica cannot overrule live ones that merely answer slowly.
A replica that becomes ready tells its downstream replicas its position (SEQAT) so that a
downstream replica holding a different position resynchronises at once; so does a replica whose
stream has been idle for BEACON_S (once per position), so that writes lost just before a quiet
period are not missed until the next write.

Reconfiguration (a new epoch, take_over; also a live switch between these three protocols,
whose streams all start at replicas[0]) keeps the numbering: every survivor keeps its position
and tells its new downstream replicas where it stands, so a replica whose new upstream is
ahead (the failed one had not forwarded everything) or behind (a promoted ms-ec replica that
had not received the old master's last writes) resynchronises from it; equal positions in one
numbering mean equal states, so nothing is copied when nothing was missed. A replica promoted to
origin (ms-ec master, aa-sc sequencer) first polls the survivors' positions (POSQ/POS, within
sync_timeout) and copies from one that is ahead of it before it serves.
"""
from __future__ import annotations

import zlib
from abc import abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar

from mlsyskit.tools.kv.controlets.aa_ec_exit import GATHER_KINDS, GATHERING, LeavingVersions
from mlsyskit.tools.kv.controlets.base import (
    NOT_SERVING,
    RECONFIGURED,
    TRYAGAIN,
    Action,
    Apply,
    Commit,
    Controlet,
    Fail,
    Reset,
    Send,
    StreamFailure,
)
from mlsyskit.tools.kv.controlets.streamlog import StreamHistory
from mlsyskit.tools.kv.controlets.streamparts import ValueParts
from mlsyskit.tools.kv.controlets.streamtail import (
    CONFIRMING,
    POLLING,
    READY,
    RECEIVING,
    TAILING,
    WAITING,
    LogTail,
)
from mlsyskit.tools.kv.controlets.undo import ROLLING, UNDO_KINDS, UNDOING, UndoWrites

SYNC_KINDS = (b"SYNCREQ", b"SYNCBUSY", b"SNAPBEGIN", b"SNAPDATA", b"SNAPEND", b"SEQAT", b"POSQ", b"POS",
              *GATHER_KINDS)
SYNC_KINDS += (b"SNAPCHAIN", b"LOGBEGIN", b"LOGDATA", b"LOGEND")  # the log tail (streamlog.py)
SYNC_KINDS += (b"SNAPPART",)  # a value larger than a snapshot chunk, in parts (streamparts.py)
SYNC_KINDS += UNDO_KINDS  # a write failed on a replica: taken back everywhere (undo.py)
CATCHING_UP = f"{TRYAGAIN} replica is catching up; retry"  # waiting operations failed: outcome unknown
REFUSED_CATCHING_UP = f"{NOT_SERVING} replica is catching up; retry"  # a new operation, not executed
BEACON_S = 1.0  # an origin or relay idle this long tells its downstream replicas its position once


class OrderedStream(LogTail, LeavingVersions, UndoWrites, Controlet):
    """A replica that applies its upstream's numbered stream in order, catching up on any gap."""

    STREAM: ClassVar[bytes]  # the message kind that carries the numbered stream
    # A replica promoted to origin by a failover first asks the survivors their positions and
    # copies from one that is ahead of it (ms-ec: fewer writes lost; aa-sc: a slot some replica
    # applied is not dropped). ms-sc needs no poll: a new head is ahead of everyone downstream.
    POLL_ON_PROMOTION: ClassVar[bool] = True
    READY_MODE = READY

    def __init__(self, node_id: str, replicas: Sequence[str], epoch: int, options: Any = None,
                 incarnation: int = 0) -> None:
        super().__init__(node_id, replicas, epoch, options, incarnation)
        self.applied = 0  # the origin: last number assigned; the others: last number applied
        self.mode = READY
        self.gaps = 0
        self.syncs = 0
        self.token = incarnation << 32
        self.sync_source: str | None = None
        self.sync_deadline = 0.0
        self.sync_order: tuple[str, ...] = ()
        self.sync_next = 0
        self.busy: set[str] = set()
        self.base = 0
        self.buffer: list[tuple[str, Sequence[Any]]] = []
        self.positions: dict[str, int] = {}  # POLLING: survivors' positions so far
        self.beacon_at, self.beacon_seq, self.beaconed = 0.0, -1, -1
        self.prefer: str | None = None  # the next catch-up asks this replica first
        self.sync_keys = 0  # pairs received in the current (or last) snapshot: catch-up progress
        self.sync_bytes = 0  # their key + value bytes
        self.parts = ValueParts()  # a large value of the snapshot being received, in parts
        self.sync_began = 0.0
        self.last_sync_s = 0.0  # SNAPBEGIN to SNAPEND of the last completed snapshot (injected clock)
        self.history = StreamHistory(self.options.log_bytes)
        self.snap_chain: tuple[int, int] | None = None  # SNAPCHAIN: the source's checksum at the snapshot
        self.tail_entries = self.tail_bytes = 0  # the current (or last) log tail received
        self.copy = {"snapshots": 0, "tails": 0, "copied_bytes": 0, "tails_served": 0, "snapshots_served": 0}
        self.join_began: float | None = None  # a learner's join: serving again measures its catch-up
        self.join_catch_up_s = 0.0
        self.learner_copy_s = 0.0  # the snapshot this node copied as a learner before it joined
        self.init_undo()

    # -- what a concrete protocol supplies ------------------------------------------
    @property
    @abstractmethod
    def upstream(self) -> str | None:
        """The replica whose stream this one applies (None: this replica is the origin)."""

    @abstractmethod
    def downstream(self) -> Sequence[str]:
        """Replicas that apply this replica's stream (told our position after a catch-up)."""

    @abstractmethod
    def sync_sources(self) -> Sequence[str]:
        """Replicas to catch up from, most preferred first."""

    @abstractmethod
    def apply_stream(self, src: str, seq: int, fields: Sequence[Any]) -> list[Action]:
        """Apply stream message number `seq` (already checked to be the next one)."""

    @abstractmethod
    def fail_pending(self, message: str) -> list[Action]:
        """Fail every client request waiting on peers (its messages may be lost)."""

    def on_synced(self) -> list[Action]:
        """Caught up (state as of self.applied): tell downstream replicas where we are."""
        if self.join_began is not None:  # a learner that joined serves again: its catch-up took this long
            self.join_catch_up_s, self.join_began = self.now - self.join_began, None
        return [Send(n, b"SEQAT", self.history.position(self.applied) or (self.applied,)) for n in self.downstream()]

    def on_position(self, src: str, seq: int) -> list[Action]:
        """The upstream says it stands at `seq` and we are ready at the same position."""
        return []

    # -- the shared machinery ---------------------------------------------------------
    @property
    def ready(self) -> bool:
        return self.mode is READY

    def on_start(self) -> list[Action]:
        self.history.forget(self.applied)  # what the datalet holds after a (re)start is no known position
        if len(self.replicas) == 1:
            return []
        return self.begin_sync()

    def take_over(self, old: Controlet) -> list[Action]:
        # ms-sc, ms-ec and aa-sc number one stream from replicas[0] (head, master, sequencer), so a
        # live switch between them keeps every position too; anything else starts afresh.
        if getattr(old, "versioned", False) or getattr(old, "lww", None) is not None:
            return self.leave_versions(old)  # from aa-ec: converge at replicas[0] first (aa_ec_exit.py)
        if not isinstance(old, OrderedStream):
            return super().take_over(old)
        self.applied, self.gaps, self.syncs = old.applied, old.gaps, old.syncs
        self.inherit_undo(old)
        self.inherit_history(old)
        out = self.carry_pending(old)
        if old.mode is not READY:
            return out + self.begin_sync()
        if self.POLL_ON_PROMOTION and self.upstream is None and old.upstream is not None and self.others:
            self.mode, self.positions, self.token = POLLING, {}, self.token + 1
            self.sync_deadline = self.now + self.options.sync_timeout
            return out + [Send(n, b"POSQ", (self.token,)) for n in self.others]
        if type(old) is not type(self) and self.upstream is not None:
            # A live switch: the old protocol's replica may lag its origin (ms-ec answers before it
            # replicates), so serve nothing until the upstream confirms the same position.
            self.mode, self.sync_deadline = CONFIRMING, self.now + 4 * self.options.sync_timeout
            return out
        return out + self.on_synced()

    def carry_pending(self, old: OrderedStream) -> list[Action]:
        """What `old` was waiting on under the previous map. Default: fail it (outcome unknown)."""
        return old.fail_pending(RECONFIGURED)

    def begin_sync(self) -> list[Action]:
        """Stop applying and catch up from a live replica."""
        out = self.fail_pending(CATCHING_UP)
        self.mode = WAITING
        self.syncs += 1
        self.buffer = []
        order = tuple(self.sync_sources())
        if self.prefer in order:
            order = (self.prefer,) + tuple(n for n in order if n != self.prefer)
        self.prefer, self.sync_order = None, order
        self.snap_chain = None
        self.sync_next = 0
        self.busy = set()
        return out + self._ask_next()

    def _ask_next(self) -> list[Action]:
        if self.sync_next >= len(self.sync_order):  # one full round without a snapshot
            if self.index == 0 and self.busy >= set(self.others):
                self.mode = READY  # every other replica is alive and catching up itself: start here
                self.history.restart(self.applied, zlib.crc32(b"%d" % self.token))  # a history of its own
                return self.on_synced()
            self.sync_next = 0
            self.busy = set()
        self.sync_source = self.sync_order[self.sync_next]
        self.sync_next += 1
        self.token += 1
        self.sync_deadline = self.now + self.options.sync_timeout
        return [Send(self.sync_source, b"SYNCREQ", (self.token, *self.history.position(self.applied)))]

    def tick_sync(self, now: float) -> list[Action]:
        if self.mode is READY:
            return self._beacon(now) + self.tick_commit()
        if self.mode is GATHERING or self.mode is UNDOING:
            return self.tick_gather(now) if self.mode is GATHERING else self.tick_undo()
        if now <= self.sync_deadline:
            return []
        if self.mode is CONFIRMING:  # the upstream never said where it stands: copy its state
            return self.begin_sync()
        if self.mode is POLLING:  # decide with the survivors that answered
            return self._polled()
        if self.mode is RECEIVING or self.mode is TAILING or self.mode is ROLLING:  # silent source or origin
            return self.begin_sync()
        return self._ask_next()

    def on_stream(self, src: str, fields: Sequence[Any]) -> list[Action]:
        if src != self.upstream:
            return []
        if self.mode is RECEIVING:
            if src == self.sync_source:
                self.buffer.append((src, fields))
            return []
        if self.mode is WAITING or self.mode is TAILING or self.mode is ROLLING or self.mode is UNDOING:
            return []  # the snapshot or the tail will hold it; or it follows a write to be undone
        if self.mode is CONFIRMING:  # the upstream's position should have come first: copy instead
            return self.begin_sync()
        seq = int(fields[0])
        if seq != self.applied + 1:
            self.gaps += 1
            return self.begin_sync()
        self.applied = seq
        self.history.record(seq, fields)
        return self.apply_stream(src, seq, fields)

    def on_sync_message(self, src: str, kind: bytes, fields: Sequence[Any]) -> list[Action]:
        if kind in GATHER_KINDS:
            return self.on_gather_message(src, kind, fields)
        if kind in UNDO_KINDS:
            return self.on_undo_message(src, kind, fields)
        if kind == b"SYNCREQ":
            if self.mode is not READY:
                return [Send(src, b"SYNCBUSY", (fields[0],))]
            return self.answer_sync(src, fields)
        if kind == b"POSQ":
            return [Send(src, b"POS", (fields[0], self.applied if self.mode is READY else -1))]
        token = int(fields[0])
        if kind == b"POS":
            if self.mode is POLLING and token == self.token and src in self.others:
                self.positions[src] = int(fields[1])
                if len(self.positions) == len(self.others):
                    return self._polled()
            return []
        if kind == b"SYNCBUSY":
            if self.mode is WAITING:
                self.busy.add(src)
                if token == self.token and self.lww is None:  # leaving aa-ec: wait for GREADY instead
                    return self._ask_next()
            return []
        if kind == b"SEQAT":
            if src != self.upstream or self.mode not in (READY, CONFIRMING):
                return []
            seq = token
            # Equal numbers, different histories (an ms-ec replica promoted behind the others
            # renumbers): the checksums differ, and the catch-up below becomes a whole snapshot.
            mine = self.history.position(self.applied)
            other = mine and len(fields) > 1 and int(fields[1]) != mine[1]
            if self.mode is CONFIRMING and seq == self.applied and not other:
                self.mode = READY
                return self.on_synced() + self.on_position(src, seq)
            if seq != self.applied or other:
                self.gaps += 1
                return self.begin_sync()
            return self.on_position(src, seq)
        if token != self.token or src != self.sync_source:
            return []  # a stale snapshot (an abandoned attempt, an earlier incarnation)
        self.sync_deadline = self.now + 10 * self.options.sync_timeout
        if kind == b"SNAPCHAIN" and self.mode is WAITING:
            self.snap_chain = (int(fields[1]), int(fields[2]))
            return []
        if kind[:3] == b"LOG":
            return self._on_tail(src, kind, fields)
        if kind == b"SNAPBEGIN" and self.mode is WAITING:
            self.history.forget(self.applied)  # the datalet is emptied: no position holds until SNAPEND
            self.mode, self.base, self.sync_keys, self.sync_bytes = RECEIVING, int(fields[1]), 0, 0
            self.parts.clear()
            self.sync_began = self.now
            self.lww = None  # a replica leaving aa-ec: its versioned records go now
            return [Reset()]
        if kind == b"SNAPPART" and self.mode is RECEIVING:
            self.parts.add(fields)
            self.sync_bytes += len(fields[2])
            return []
        if kind == b"SNAPDATA" and self.mode is RECEIVING:
            self.sync_keys += (len(fields) - 1) // 2
            self.sync_bytes += sum(len(f) for f in fields[1:])
            return [Apply(k, v) for k, v in self.parts.pairs(fields)]
        if kind == b"SNAPEND" and self.mode is RECEIVING:
            self.mode, self.applied = READY, self.base
            self.last_sync_s = self.now - self.sync_began
            chain = self.snap_chain[1] if self.snap_chain and self.snap_chain[0] == self.base else None
            self.history.restart(self.base, chain)
            self.copy["snapshots"] += 1
            self.copy["copied_bytes"] += self.sync_bytes
            out = ([Commit(self.base)] if self.UNDO else []) + self.on_synced()  # before-images start here
            buffered, self.buffer = self.buffer, []
            for bsrc, bfields in buffered:
                out.extend(self.on_stream(bsrc, bfields))
            return out
        return []

    def record(self, fields: Sequence[Any]) -> None:
        """The origin numbered message fields[0] (= self.applied): keep it for catch-up by log tail."""
        self.history.record(self.applied, fields)

    def inherit_history(self, old: OrderedStream) -> None:
        """Under a new map: the same replica's history, log and copy counters carry over."""
        self.history, self.copy = old.history, old.copy
        if old.topology != self.topology and not getattr(old, "learner", False):
            # A live switch between ms and aa: the log holds messages of another format (aa-sc's carry
            # origin and request id; ms-sc's and ms-ec's are the same), which this protocol would
            # misapply. Keep the position and checksum, not the entries: a catch-up from before the
            # switch copies a snapshot instead of a tail.
            self.history.restart(self.history.seq, self.history.chain)
        self.sync_keys, self.sync_bytes, self.last_sync_s = old.sync_keys, old.sync_bytes, old.last_sync_s
        self.tail_entries, self.tail_bytes = old.tail_entries, old.tail_bytes
        self.join_catch_up_s, self.learner_copy_s = old.join_catch_up_s, old.learner_copy_s
        if getattr(old, "learner", False):
            self.learner_copy_s, self.join_began = old.last_sync_s, self.now
            self.copy["learner_epoch"], self.copy["learner_bytes"] = old.epoch, old.sync_bytes

    def _beacon(self, now: float) -> list[Action]:
        """Once the stream has been idle for BEACON_S: SEQAT to the downstream replicas. A gap is
        otherwise found only by the next stream message, so the last writes before a quiet period
        (lost with a link that gave up) would leave a replica behind until the next write."""
        if now < self.beacon_at:
            return []
        self.beacon_at = now + BEACON_S
        idle, self.beacon_seq = self.applied == self.beacon_seq, self.applied
        if not idle or self.beaconed == self.applied:
            return []
        self.beaconed = self.applied
        return [Send(n, b"SEQAT", self.history.position(self.applied) or (self.applied,)) for n in self.downstream()]

    def _polled(self) -> list[Action]:
        """The new origin heard the survivors: copy from the most advanced if it is ahead of us."""
        best = max(self.positions, key=lambda n: (self.positions[n], -self.replicas.index(n)), default=None)
        if best is not None and self.positions[best] > self.applied:
            self.prefer = best
            return self.begin_sync()
        self.mode = READY
        return self.on_synced()

    def refuse_if_catching_up(self, req: Any) -> list[Action] | None:
        return None if self.mode is READY else [Fail(req, REFUSED_CATCHING_UP)]

    def on_apply_failed(self, req: Any) -> list[Action]:
        """A replicated write failed here: undo it everywhere (undo.py), or catch up again."""
        if type(req) is StreamFailure:
            if req.seq:
                return self.write_failed(req)
            req = req.req  # an unnumbered write (ms-ec, a snapshot's pair)
        if req is not None:
            return []
        self.history.forget(self.applied)
        return self.begin_sync()

    def state(self) -> dict[str, Any]:
        return {**super().state(), "catching_up": int(self.mode is not READY), "gaps": self.gaps,
                "syncs": self.syncs, "sync_keys": self.sync_keys, "sync_bytes": self.sync_bytes,
                "last_sync_s": round(self.last_sync_s, 4), "sync_source": self.sync_source or "-",
                "log_entries": len(self.history.entries), "log_bytes": self.history.bytes,
                "tail_entries": self.tail_entries, "tail_bytes": self.tail_bytes, **self.copy,
                "join_catch_up_s": round(self.join_catch_up_s, 4),
                "learner_copy_s": round(self.learner_copy_s, 4), "mode": self.mode,
                "holds_aa_ec": int(self.lww is not None), "gather_waits": ",".join(sorted(self.gather_pending)) or "-",
                "gathered_keys": self.gathered_keys}
