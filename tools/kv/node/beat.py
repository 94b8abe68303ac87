"""Heartbeats on their own thread, so a long event-loop turn cannot starve them (issue 22).

A node's event loop may be busy for seconds (a pipeline of 100k requests, a large value copied, a
loaded host): heartbeats sent from it stopped for as long, and the coordinator failed a healthy
node over. This thread beats every `interval_s` with its own blocking connection to the embedded
coordinator, whatever the loop is doing. Each answer is published twice: as `latest`, one tuple
(sent, known, epoch) replaced whole (a single reference store: the loop reads it without a lock),
and to the loop (`on_answer`, by call_soon_threadsafe), where the agent follows a new map. The
lease is renewed from the time the beat was *sent* (the lease rule in agent.py: the coordinator
heard from the node no earlier than then), and the loop takes `latest` itself whenever it finds
its lease lapsed (control.py): a loop starved past the callbacks still holds the lease the
thread's answers earned, checked against the loop's own map at the moment it serves. A beat
that fails leaves `latest` alone, so a node the coordinator does not hear from loses its lease
on time. A loop that has not taken an answer for `max_loop_stall_s` (a wedged node, not a busy
one) gets no more beats, so it is failed over as a dead one would be. ZooKeeper needs none of
this: its session is kept alive by kazoo's own thread.
"""
from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

from mlsyskit.core.clock import Clock, RealClock


class HeartbeatThread:
    """Beats `node_id` every `interval_s` on a daemon thread; answers go to the loop as
    on_answer(sent, known, epoch)."""

    def __init__(self, client: Any, node_id: str, interval_s: float, applied: Callable[[], int | None],
                 on_answer: Callable[[float, bool, int | None], None], loop: asyncio.AbstractEventLoop,
                 clock: Clock | None = None, max_loop_stall_s: float = 15.0) -> None:
        self.client, self.node_id, self.interval_s = client, node_id, interval_s
        self.max_loop_stall_s = max_loop_stall_s
        self.applied, self.on_answer, self.loop = applied, on_answer, loop
        self.clock = clock or RealClock()
        self.stopped = threading.Event()
        self.beats = self.failures = 0
        self.last_answer = float("-inf")  # when (sent) the latest answered beat left
        self.loop_took = self.clock.now()  # when the loop last ran a callback of ours (it is turning)
        self.withheld = 0  # beats not sent because the loop was wedged
        self.latest: tuple[float, bool, int | None] | None = None  # the newest answer: (sent, known, epoch)
        self.thread = threading.Thread(target=self._run, name=f"heartbeat-{node_id}", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stopped.set()

    def _touch(self) -> None:
        """On the loop, once per round: the loop is turning."""
        self.loop_took = self.clock.now()

    def beat(self, sent: float) -> bool:
        """One heartbeat, sent at `sent` (read before sending); False when the loop has closed."""
        try:
            self.loop.call_soon_threadsafe(self._touch)
        except RuntimeError:  # the loop closed: the node is stopping
            return False
        if sent - self.loop_took > self.max_loop_stall_s:  # wedged, not busy: let it be failed over
            self.withheld += 1
            return True
        try:
            applied = self.applied()  # an int read under the GIL: the loop may be mid-turn
            known = self.client.heartbeat(self.node_id, applied)
            epoch = self.client.last_epoch
        except Exception:  # noqa: BLE001 - the coordinator is away: the lease lapses, the next beat retries
            self.failures += 1
            return True
        self.beats += 1
        self.last_answer = sent
        self.latest = (sent, known, epoch)  # one store: the loop reads a whole answer or the previous one
        try:
            self.loop.call_soon_threadsafe(self.on_answer, sent, known, epoch)
        except RuntimeError:  # the loop closed: the node is stopping
            return False
        return True

    def _run(self) -> None:
        while not self.stopped.is_set():
            sent = self.clock.now()
            if not self.beat(sent):
                break
            self.stopped.wait(max(0.0, sent + self.interval_s - self.clock.now()))
        close = getattr(self.client, "close", None)
        if close is not None:
            close()
