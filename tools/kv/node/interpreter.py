"""The one interpreter of controlet actions, for the node runtime and the simulator.

A controlet (controlets/base.py) answers every event with a list of actions; this carries them
out, in order, against a datalet and a Transport. Datalet operations (Apply, Reset, Read,
SendStored) are issued at once and in order; with a synchronous datalet and nothing queued the
whole list runs now, else the list waits as a batch until its datalet results are in (a remote
datalet's futures), so no list's effects overtake an earlier one's.

A datalet error fails its request and stops the rest of its batch: every Send (and Commit) computed
before the failure was known is dropped too (each batch carries the failure count it was made under),
a read computed before it is failed with -TRYAGAIN (it may see a write about to be undone), and the
transport hears of it (on_apply_failed: a StreamFailure for a numbered write) so the controlet can
undo the write everywhere or catch up. A numbered write (Apply.seq) keeps the key's before-image
(undolog.py) until a Commit; an Undo restores them, newest first. An Undo is issued only once every
datalet result before it is in (a remote datalet's images arrive with its replies), and the
batches after it wait behind it, so nothing overtakes the restore. A Snapshot streams the datalet
(snapshot.py) in a task the transport runs.

The runtime and the simulator differ only in their Transport (how a message, a forwarded request
and an answer reach their destination, how a task runs) and their clock, never in this.
"""
from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Coroutine
from typing import Any, Protocol

from mlsyskit.tools.kv.controlets.base import (
    TRYAGAIN,
    Apply,
    Commit,
    Fail,
    Forward,
    Read,
    Reply,
    Reset,
    Send,
    SendStored,
    Snapshot,
    StreamFailure,
    Undo,
)
from mlsyskit.tools.kv.controlets.batch import ApplyBatch, ReplyBatch, as_singles
from mlsyskit.tools.kv.datalets.base import Datalet
from mlsyskit.tools.kv.node.snapshot import stream_snapshot
from mlsyskit.tools.kv.node.undolog import UndoLog
from mlsyskit.tools.kv.redis import rmw

DATALET_KINDS = frozenset((Apply, Reset, Read, SendStored, Undo))  # actions that start a datalet operation
UNISSUED = object()  # a datalet action of a batch waiting behind an Undo: issued when the batch is first
READ_STOPPED = f"{TRYAGAIN} a write failed on this replica while this read waited; retry"


class Transport(Protocol):
    """Where actions leave the interpreter: the runtime's sockets, or the simulator's network."""

    def frame(self, kind: bytes, fields: tuple) -> Any:
        """A peer message as it goes on the wire (built once per Send, reused for its fan-out)."""

    def send(self, node: str, frame: Any) -> None: ...

    def forward(self, req: Any, node: str) -> None: ...

    def reply(self, req: Any) -> None:
        """A write is done here (its reply or its existed flag is on the request)."""

    def answer(self, req: Any, stored: bytes | None) -> None:
        """A read of the stored bytes (None: absent)."""

    def fail(self, req: Any, message: str) -> None: ...

    def spawn(self, work: Coroutine) -> None:
        """Run a background task (a snapshot's export) on the host's loop."""

    def on_apply_failed(self, req: Any) -> None:
        """A datalet write failed (req None: a replicated one): the controlet must catch up."""


class Failed:
    """A datalet operation that raised (kept as a value so a batch can stop cleanly)."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


class Interpreter:
    def __init__(self, datalet: Datalet | None, transport: Transport, stats: dict[str, int]) -> None:
        self.datalet = datalet
        self.transport = transport
        self.stats = stats  # datalet_errors, sends_dropped
        self.sync = datalet is not None and not datalet.is_async
        # The value as held (the memory datalet's may be live: immutable, so as good as its bytes).
        self.peek = getattr(datalet, "peek", None) if self.sync else None
        # (failure count, batch, issued) waiting on datalet results; issued False: behind an Undo
        self.queue: deque[tuple[int, list, bool]] = deque()
        self.held = 0  # queued batches not yet issued (an Undo, and every batch after it)
        self.undo = UndoLog()
        self.failures = 0  # datalet failures so far: batches made before the latest one drop their Sends
        self.resets = 0  # datalet emptied (a catch-up began here): a snapshot being streamed from it stops
        self._sent_fields: tuple | None = None
        self._sent_kind = b""
        self._sent_frame: Any = None

    def execute(self, actions: list) -> None:
        if not actions:
            return
        if self.sync and not self.queue:
            self._run_now(actions)
            return
        actions = as_singles(actions)  # queued (a remote datalet's futures, or behind an Undo): one by one
        if self.held or any(type(a) is Undo for a in actions):
            self.held += 1
            self.queue.append((self.failures, [(a, UNISSUED if type(a) in DATALET_KINDS else None)
                                               for a in actions], False))
            self._drain()
            return
        batch = []
        last = None
        for a in actions:
            if type(a) in DATALET_KINDS:
                last = self._issue(a)
                batch.append((a, last))
            else:
                batch.append((a, None))
        self.queue.append((self.failures, batch, True))
        if isinstance(last, asyncio.Future) and not last.done():
            last.add_done_callback(self._drain)
        else:
            self._drain()

    def _issue(self, a: Any) -> Any:
        """Start a datalet operation; a synchronous datalet's exception is returned, not raised."""
        try:
            kind = type(a)
            if kind is Apply:
                value = a.value if a.op is None else self._delta(a)
                if a.seq:
                    return self.datalet.swap(a.key, value)  # the before-image, kept by _finish
                return self.datalet.delete(a.key) if value is None else self.datalet.put(a.key, value)
            if kind is Reset:
                self.resets += 1
                self.undo.reset()
                return self.datalet.clear()
            if kind is Undo:
                return self._undo(a.seq)
            if kind is SendStored:
                return self.datalet.get(a.key)
            if self.peek is not None and getattr(a.req, "rmw", None) is not None:
                return self.peek(a.req.key)  # a query (HGET, LLEN ...) looks into a live value: redis/live.py
            return self.datalet.get(a.req.key)  # every other read needs the bytes: deadlines, types, versions
        except Exception as e:  # noqa: BLE001 - a datalet error fails the request, never the node
            return Failed(e)

    def _delta(self, a: Apply) -> bytes | None:
        """A write replicated as its command: the key's bytes it makes here (now, in apply order)."""
        if not self.sync:
            raise RuntimeError("a write replicated as a command needs a local datalet (memory or lmdb)")
        return rmw.apply(a.op, self.datalet.get_live(a.key))[0]  # a live list: the push is O(pushed)

    def _undo(self, seq: int) -> Any:
        """Restore the before-images of every write numbered >= seq (the last operation's result)."""
        images = self.undo.take(seq)
        if images is None:
            return Failed(RuntimeError(f"cannot undo from write {seq}: its before-image is gone"))
        last = None
        try:
            for _, key, before in images:
                last = self.datalet.delete(key) if before is None else self.datalet.put(key, before)
        except Exception:
            self.undo.put_back(images)  # a local datalet refused a restore: the controlet retries it
            raise
        return last

    def _run_now(self, actions: list) -> None:
        """A synchronous datalet: every action now; after a failure the rest as _skipped says."""
        failed: set[int] | None = None
        for a in actions:
            kind = type(a)
            if kind is ApplyBatch or kind is ReplyBatch:  # a pipeline batch (controlets/batch.py)
                failed = self._apply_batch(a, failed) if kind is ApplyBatch else self._reply_batch(a, failed)
                continue
            if failed is not None and (self._skipped(a, failed) or kind is Apply and -a.seq in failed):
                continue  # (-seq: a batch entry's writes after one that failed: never issued, see below)
            res = self._issue(a) if kind in DATALET_KINDS else None
            if type(res) is Failed:
                failed = failed or set()
                if type(a) is Apply and a.seq:
                    # the rest of its numbered entry (a pipeline batch, controlets/batch.py) is not
                    # issued: on_apply_failed's Undo has already run, and would not take them back
                    failed.add(-a.seq)
                self._datalet_failed(a, res.error, failed)
            else:
                self._finish(a, res)

    def _apply_batch(self, a: ApplyBatch, failed: set[int] | None) -> set[int] | None:
        """A batch's writes as one step: the same outcome as one Apply per write, with a tenth of the
        calls. A failed numbered write stops its batch (the rest is never issued, as _run_now does);
        an unnumbered one (ms-ec) fails alone."""
        seq, reqs = a.seq, a.reqs
        if failed is not None and -seq in failed:
            return failed
        if a.ops is not None:
            return self._apply_mixed(a, failed)
        keys, values = a.keys, a.values
        many = getattr(self.datalet, "write_many", None)  # the memory datalet's: one step (datalets/memory.py)
        try:
            befores = None if many is None else many(keys, values)
        except Exception:  # noqa: BLE001 - it changed nothing: the loop below finds the write that fails
            befores = None
        if befores is not None:
            if seq:
                self.undo.keep_batch(seq, keys, befores)
            return failed
        write = self.datalet.swap if seq else self.datalet.put
        n, start = len(keys), 0
        while start < n:
            befores: list[Any] = []
            keep = befores.append
            try:
                for i in range(start, n):
                    keep(write(keys[i], values[i]))
            except Exception as e:  # noqa: BLE001 - a datalet error fails the request, never the node
                i = start + len(befores)
                if seq:
                    self.undo.keep_batch(seq, keys[start:i], befores)
                failed = failed or set()
                if seq:
                    failed.add(-seq)
                self._datalet_failed(Apply(keys[i], values[i], None if reqs is None else reqs[i], seq), e, failed)
                if seq:
                    return failed
                start = i + 1
                continue
            if seq:
                self.undo.keep_batch(seq, keys[start:] if start else keys, befores)
            break
        return failed

    def _apply_mixed(self, a: ApplyBatch, failed: set[int] | None) -> set[int] | None:
        """A batch with deletes or deltas (controlets/batch.py MIXED), write by write in order. Its first
        failed write stops it: numbered, the batch is taken back everywhere (as _apply_batch); else (an
        ms-ec master) the writes after it fail unapplied: they were resolved as if it applied."""
        keys, seq, reqs, ops, values, datalet = a.keys, a.seq, a.reqs, a.ops, a.values, self.datalet
        befores: list[Any] = []
        keep = befores.append
        try:
            for i, key in enumerate(keys):
                op = ops[i]
                value = values[i] if op is None else rmw.apply(op, datalet.get_live(key))[0]
                if seq:
                    keep(datalet.swap(key, value))
                elif value is None:
                    datalet.delete(key)
                else:
                    datalet.put(key, value)
        except Exception as e:  # noqa: BLE001 - a datalet error fails the request, never the node
            failed = failed or set()
            if seq:  # the rest of the batch is failed by the controlet's undo (on_apply_failed)
                self.undo.keep_batch(seq, keys[:i], befores)
                failed.add(-seq)
            self._datalet_failed(Apply(keys[i], values[i], None if reqs is None else reqs[i], seq, ops[i]), e, failed)
            for r in () if seq or reqs is None else reqs[i + 1:]:
                failed.add(id(r))
                self.transport.fail(r, f"{TRYAGAIN} not applied: an earlier write of its pipeline batch failed ({e})")
            return failed
        if seq:
            self.undo.keep_batch(seq, keys, befores)
        return failed

    def _reply_batch(self, a: ReplyBatch, failed: set[int] | None) -> set[int] | None:
        reqs = a.reqs if failed is None else [r for r in a.reqs if id(r) not in failed]
        if reqs:
            reply_all = getattr(self.transport, "reply_all", None)
            if reply_all is not None:
                reply_all(reqs)
            else:
                for r in reqs:
                    self.transport.reply(r)
        return failed

    def _drain(self, _f: Any = None) -> None:
        queue = self.queue
        while queue:
            made_under, batch, issued = queue[0]
            if not issued:
                queue[0] = (made_under, batch, True)
                if self._issue_held(batch):
                    return
            for _, res in batch:
                if isinstance(res, asyncio.Future) and not res.done():
                    return
            queue.popleft()
            failed: set[int] = set()
            stopped = made_under != self.failures
            for a, res in batch:
                if isinstance(res, asyncio.Future):
                    res = res.exception() and Failed(res.exception()) or res.result()
                if type(res) is Failed:
                    stopped = True
                    self._datalet_failed(a, res.error, failed)
                elif not (stopped and self._skipped(a, failed)):
                    self._finish(a, res)

    def _issue_held(self, batch: list) -> bool:
        """Issue the datalet actions of a batch that waited behind an Undo, now that it is first;
        True when one of them is still running (the drain resumes when it is done)."""
        self.held -= 1
        last = None
        for i, (a, res) in enumerate(batch):
            if res is UNISSUED:
                last = self._issue(a)
                batch[i] = (a, last)
        if isinstance(last, asyncio.Future) and not last.done():
            last.add_done_callback(self._drain)
            return True
        return False

    def _skipped(self, a: Any, failed: set[int]) -> bool:
        """After a datalet failure: Sends, Commits and Snapshots made before it was known, and every
        action of a failed request, are dropped; reads made before it are failed (retry)."""
        kind = type(a)
        if kind is Send or kind is Snapshot or kind is Commit or id(getattr(a, "req", None)) in failed:
            self.stats["sends_dropped"] += kind is Send
            return True
        if kind is Read:
            self.transport.fail(a.req, READ_STOPPED)
            return True
        return False

    def _datalet_failed(self, a: Any, error: BaseException, failed: set[int]) -> None:
        """Fail the request, stop the batch, and let the controlet resynchronise."""
        self.stats["datalet_errors"] += 1
        self.failures += 1
        req = getattr(a, "req", None)
        if req is not None:
            failed.add(id(req))
            self.transport.fail(req, f"datalet error: {error}")
        kind = type(a)
        if kind is Apply:
            self.transport.on_apply_failed(StreamFailure(a.seq, f"{error}", req, a.key))
        elif kind is Undo:
            self.transport.on_apply_failed(StreamFailure(-a.seq, f"undo failed: {error}"))
        elif kind is Reset:
            self.transport.on_apply_failed(None)

    def _finish(self, a: Any, res: Any) -> None:
        """Complete an action whose datalet operation (if any) has finished: the one dispatch."""
        kind = type(a)
        if kind is Send:
            self.send_message(a.node, a.kind, a.fields)
        elif kind is Apply:
            if a.seq:
                self.undo.keep(a.seq, a.key, res)
                if a.req is not None and a.value is None:
                    a.req.existed = res is not None
            elif a.req is not None and a.value is None:
                a.req.existed = bool(res)
        elif kind is Commit:
            self.undo.commit(a.seq)
        elif kind is Reply:
            self.transport.reply(a.req)
        elif kind is Read:
            self.transport.answer(a.req, res)
        elif kind is Forward:
            self.transport.forward(a.req, a.node)
        elif kind is Fail:
            self.transport.fail(a.req, a.message)
        elif kind is SendStored:
            if res is not None:
                self.send_message(a.node, a.kind, (a.key, res))
        elif kind is Snapshot:
            stream_snapshot(self, a)

    def send_message(self, node: str, kind: bytes, fields: tuple) -> None:
        """One peer message; a Send fanned out to several replicas is framed once."""
        if fields is not self._sent_fields or kind is not self._sent_kind:  # held: ids stay unique
            self._sent_fields, self._sent_kind = fields, kind
            self._sent_frame = self.transport.frame(kind, fields)
        self.transport.send(node, self._sent_frame)

    def spawn(self, work: Coroutine) -> None:
        self.transport.spawn(work)

