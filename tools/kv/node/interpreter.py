"""The one interpreter of controlet actions, for the node runtime and the simulator.

A controlet (controlets/base.py) answers every event with a list of actions; this carries them
out, in order, against a datalet and a Transport. Datalet operations (Apply, Reset, Read,
SendStored) are issued at once and in order; with a synchronous datalet and nothing queued the
whole list runs now, else the list waits as a batch until its datalet results are in (a remote
datalet's futures), so no list's effects overtake an earlier one's.

A datalet error fails its request and stops the rest of its batch: every Send computed before the
failure was known is dropped too (each batch carries the failure count it was made under), and
the transport hears of it (on_apply_failed) so the controlet can catch up. A Snapshot streams the
datalet (snapshot.py) in a task the transport runs.

The runtime and the simulator differ only in their Transport (how a message, a forwarded request
and an answer reach their destination, how a task runs) and their clock, never in this.
"""
from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Coroutine
from typing import Any, Protocol

from mlsyskit.tools.kv.controlets.base import (
    Apply,
    Fail,
    Forward,
    Read,
    Reply,
    Reset,
    Send,
    SendStored,
    Snapshot,
)
from mlsyskit.tools.kv.datalets.base import Datalet
from mlsyskit.tools.kv.node.snapshot import stream_snapshot

DATALET_KINDS = frozenset((Apply, Reset, Read, SendStored))  # actions that start a datalet operation


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
        self.queue: deque[tuple[int, list]] = deque()  # (failure count, batch) waiting on datalet results
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
        batch = []
        last = None
        for a in actions:
            if type(a) in DATALET_KINDS:
                last = self._issue(a)
                batch.append((a, last))
            else:
                batch.append((a, None))
        self.queue.append((self.failures, batch))
        if isinstance(last, asyncio.Future) and not last.done():
            last.add_done_callback(self._drain)
        else:
            self._drain()

    def _issue(self, a: Any) -> Any:
        """Start a datalet operation; a synchronous datalet's exception is returned, not raised."""
        try:
            kind = type(a)
            if kind is Apply:
                return self.datalet.delete(a.key) if a.value is None else self.datalet.put(a.key, a.value)
            if kind is Reset:
                self.resets += 1
                return self.datalet.clear()
            if kind is SendStored:
                return self.datalet.get(a.key)
            return self.datalet.get(a.req.key)  # every read needs the bytes: deadlines, types, versions
        except Exception as e:  # noqa: BLE001 - a datalet error fails the request, never the node
            return Failed(e)

    def _run_now(self, actions: list) -> None:
        """A synchronous datalet: every action now; after a failure the rest as _skipped says."""
        failed: set[int] | None = None
        for a in actions:
            if failed is not None and self._skipped(a, failed):
                continue
            res = self._issue(a) if type(a) in DATALET_KINDS else None
            if type(res) is Failed:
                failed = failed or set()
                self._datalet_failed(a, res.error, failed)
            else:
                self._finish(a, res)

    def _drain(self, _f: Any = None) -> None:
        queue = self.queue
        while queue:
            made_under, batch = queue[0]
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

    def _skipped(self, a: Any, failed: set[int]) -> bool:
        """After a datalet failure: Sends and Snapshots made before it was known, and every action of
        a failed request, are dropped."""
        kind = type(a)
        if kind is Send or kind is Snapshot or id(getattr(a, "req", None)) in failed:
            self.stats["sends_dropped"] += kind is Send
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
        if type(a) is Apply or type(a) is Reset:
            self.transport.on_apply_failed(req)

    def _finish(self, a: Any, res: Any) -> None:
        """Complete an action whose datalet operation (if any) has finished: the one dispatch."""
        kind = type(a)
        if kind is Send:
            self.send_message(a.node, a.kind, a.fields)
        elif kind is Apply:
            if a.req is not None and a.value is None:
                a.req.existed = bool(res)
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
