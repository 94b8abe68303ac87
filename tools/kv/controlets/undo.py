"""A write that failed on any replica's datalet is taken back on every replica (ms-sc, aa-sc).

The strong controlets answer a write only once every replica has applied it, so a datalet error
(Redis's OOM, LMDB's map full, a disk error) on one replica must not leave the write on the
others: the client is told it failed, so no replica may ever show it. Every replica keeps the
before-image of each numbered write until the origin says it is final (Apply.seq, Commit;
node/undolog.py). Then:

    replica R fails write n      R sends UNDOREQ n era -> origin, undoes its own writes >= n (a
                                 remote datalet may have applied later ones before the error came
                                 back) and stops applying the stream (mode ROLLING)
    origin (head, sequencer)     fails every write numbered >= n that waits for an answer (they
                                 were ordered after n; their outcome is now "not applied"), undoes
                                 its own writes >= n after sending ROLLBACK n era reason [origin
                                 rid ...] down its stream, renumbers from n, bumps the era
    replica on ROLLBACK n        undoes its writes >= n, stands at n - 1, relays it (ms-sc: down
                                 the chain, FIFO behind the writes it undoes); R resumes when
                                 n <= its failed write, else asks again under the new era

Why nothing is ever shown: R did not apply n and every replica behind R (ms-sc: further down
the chain; aa-sc: nobody serves a slot until every replica applied it) never received it, so
no read returned n or a write after it; a read that waited on a remote datalet behind the
failed write is failed instead (node/interpreter.py). A write is final once every replica
applied it (ms-sc: the tail's ack; aa-sc: the stable slot) and the origin never rolls one back:
the origin broadcasts COMMIT so replicas forget the images. A report from an earlier era
(another replica's failure already rolled the stream back) is ignored; one whose undo is
impossible (an image trimmed, a FLUSH or snapshot in between, a restore the datalet refuses too),
or a ROLLING replica that hears nothing within write_timeout, catches up instead (stream.py): it
copies a replica that has already taken the writes back (each sends ROLLBACK on before undoing).

ms-ec and aa-ec answer a write when its first replica applied it: an error there fails it and
nothing is sent; a later replica that cannot apply an acknowledged write catches up or is
repaired (the write is never failed after it was acknowledged).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from mlsyskit.tools.kv.controlets.base import Action, Commit, Send, StreamFailure, Undo

UNDO_KINDS = (b"UNDOREQ", b"ROLLBACK", b"COMMIT")
ROLLING = "rolling back"  # a replica whose datalet failed a numbered write: waits for the origin's ROLLBACK
UNDOING = "undoing"  # a local datalet refused to restore a before-image: Undo again each clock tick
READY = "ready"


def failed_message(reason: str, first: bool) -> str:
    if first:
        return f"ERR {reason}; the write was not applied on any replica"
    return f"ERR an earlier write of the shard failed ({reason}); this write was not applied on any replica"


class UndoWrites:
    """The rollback protocol of an ordered stream (mixed into stream.OrderedStream)."""

    UNDO: ClassVar[bool] = False  # ms-sc and aa-sc: numbered writes keep before-images
    # supplied by OrderedStream / Controlet
    mode: str
    applied: int
    node_id: str
    replicas: tuple[str, ...]
    others: tuple[str, ...]
    now: float
    options: Any
    history: Any
    sync_deadline: float
    read_local: Any

    def init_undo(self) -> None:
        self.era = 0  # rollbacks so far in this stream (the origin's count; replicas follow it)
        self.failed_at = 0  # ROLLING: the write this replica failed
        self.failed_why = ""
        self.committed = 0  # the origin: every replica applied the writes up to here
        self.commit_sent = 0
        self.rollbacks = 0

    def inherit_undo(self, old: Any) -> None:
        self.era, self.committed = getattr(old, "era", 0), getattr(old, "committed", 0)

    def numbered(self, seq: int) -> int:
        """An Apply's seq: the stream number when this protocol undoes failed writes, else 0."""
        return seq if self.UNDO else 0

    # hooks of the concrete protocol
    def undo_waiting(self, seq: int, reason: str, skip: Any, rids: Sequence[Any] = ()) -> tuple[list[Action], tuple]:
        """Fail the client writes numbered >= seq this replica holds (skip: already failed); returns
        the actions and what the ROLLBACK carries for the other replicas (aa-sc: origin, rid pairs)."""
        return [], ()

    # supplied by OrderedStream: upstream (None at the origin), downstream(), begin_sync()

    # -- the protocol ---------------------------------------------------------------------
    def write_failed(self, failure: StreamFailure) -> list[Action]:
        """This replica's datalet failed numbered write failure.seq (-n: an Undo(n) failed)."""
        if failure.seq < 0 and self.read_local is not None and self.mode in (READY, ROLLING, UNDOING):
            # A local datalet still refusing writes: retry the restore each tick, serving nothing. (A copy
            # from another replica could be refused the same way, and with every replica busy the first
            # would start from what it holds, the writes it failed to take back included.)
            self.undo_from = min(-failure.seq, getattr(self, "undo_from", -failure.seq))
            self.mode = UNDOING
            return []
        if failure.seq < 0 or self.mode not in (READY, ROLLING):
            self.history.forget(self.applied)
            return self.begin_sync()
        reason = f"datalet error on {self.node_id}: {failure.error}"
        if self.upstream is None:
            return self.roll_back(failure.seq, reason, failure.req)
        if self.mode == ROLLING:
            return []  # a later write (a remote datalet answers in order): the awaited rollback covers it
        self.mode, self.failed_at, self.failed_why = ROLLING, failure.seq, reason
        self.applied = min(self.applied, failure.seq - 1)
        self.history.truncate(self.applied)
        self.sync_deadline = self.now + self.options.write_timeout + self.options.sync_timeout
        # The report first: a failing Undo stops the actions after it, and the origin must still hear.
        return [Send(self.replicas[0], b"UNDOREQ", (failure.seq, self.era, reason)), Undo(failure.seq)]

    def roll_back(self, seq: int, reason: str, skip: Any = None) -> list[Action]:
        """The origin: take back every write numbered >= seq on every replica."""
        if self.mode != READY or seq <= self.committed or seq > self.applied:
            return []
        self.era += 1
        self.rollbacks += 1
        out, carried = self.undo_waiting(seq, reason, skip)
        self.applied = seq - 1
        self.history.truncate(self.applied)
        fields = (seq, self.era, reason, *carried)
        # ROLLBACK before the local Undo: if restoring fails here (a datalet still out of memory), the
        # others still take the writes back, and this replica then copies one of them (FIFO: after it).
        return out + [Send(n, b"ROLLBACK", fields) for n in self.downstream()] + [Undo(seq)]

    def on_undo_message(self, src: str, kind: bytes, fields: Sequence[Any]) -> list[Action]:
        if kind == b"UNDOREQ":
            if self.upstream is not None or src not in self.others or int(fields[1]) != self.era:
                return []  # not the origin, or a report from before the last rollback
            return self.roll_back(int(fields[0]), _text(fields[2]))
        if kind == b"COMMIT":
            if src != self.replicas[0] or self.mode != READY:
                return []
            return [Commit(min(int(fields[0]), self.applied))]
        if src != self.upstream:
            return []
        seq, era = int(fields[0]), int(fields[1])  # ROLLBACK
        self.era = max(self.era, era)
        relay: list[Action] = [Send(n, b"ROLLBACK", tuple(fields)) for n in self.downstream()]
        out, _ = self.undo_waiting(seq, _text(fields[2]), None, fields[3:])
        if self.mode == ROLLING and seq > self.failed_at:  # not the rollback this replica asked for
            return relay + out + [Send(self.replicas[0], b"UNDOREQ", (self.failed_at, self.era, self.failed_why))]
        if self.mode == UNDOING:  # take these back too with the restore being retried
            self.undo_from, self.applied = min(self.undo_from, seq), min(self.applied, seq - 1)
            return relay + out
        if self.mode not in (READY, ROLLING):
            return relay + out + self.begin_sync()  # mid-copy: copy again, from a source that rolled back
        self.mode = READY
        self.applied = min(self.applied, seq - 1)
        self.history.truncate(self.applied)
        return relay + out + [Undo(seq)]

    def tick_undo(self) -> list[Action]:
        """UNDOING, each clock tick: restore again (a failure puts this replica back in UNDOING)."""
        self.mode = READY
        self.history.truncate(self.applied)
        return [Undo(self.undo_from)]

    def tick_commit(self) -> list[Action]:
        """The origin, each clock tick: tell the replicas which writes are final (they forget images)."""
        if self.upstream is not None or not self.UNDO or self.committed <= self.commit_sent:
            return []
        self.commit_sent = self.committed
        return [Commit(self.committed)] + [Send(n, b"COMMIT", (self.committed, self.era)) for n in self.others]


def _text(field: Any) -> str:
    return field.decode(errors="replace") if isinstance(field, bytes) else str(field)
