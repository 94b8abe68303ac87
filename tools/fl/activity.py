"""What the real server knows about each connected client between rounds: pure, clock given by the caller.

* Heartbeats: the latest resource fields a client sent (host CPU, load, free memory) and when. A
  client that has sent heartbeats and then falls silent for `misses` x `every_s` (a stopped or
  frozen host) is not offered for selection until it is heard again. Clients that never send
  heartbeats (the `join` + `submit` API) are judged by their connection alone.
* Tasks: a client sent a train task is busy until it answers (fl-client answers every task, late or
  not) or rejoins; busy clients are not offered. (A heartbeat does not free it: one sent before the
  task arrived can be read after the deadline.)
* Timing: the round trip of each update on the server's clock (`received_s`) and the
  communication time `comm_time_s` = received_s - the client's own `local_s` (task in to update
  out). Both overwrite anything the client sent under these names.
* Late work: a client that missed a round's deadline and answers afterwards did work that no one
  uses: counted in `wasted` (updates, CPU-seconds and train seconds it reported).
"""
from __future__ import annotations

import math
from typing import Any

SUPERSEDE_AFTER_S = 20.0  # a live session is replaced only after this long without a word (a loaded host lags)
HEARTBEAT_FIELDS = ("host_cpu_percent", "cpu_percent", "load1", "memory_available_bytes", "cpu_count")


def _seconds(value: Any) -> float:
    """A non-negative finite number, else 0 (a client's report is not trusted to be well-formed)."""
    return float(value) if isinstance(value, int | float) and math.isfinite(value) and value >= 0 else 0.0


class ClientActivity:
    def __init__(self, every_s: float = 2.0, misses: int = 3) -> None:
        self.every_s, self.misses = every_s, misses  # every_s 0: no heartbeats asked
        self.heard: dict[int, float] = {}
        self.resources: dict[int, dict[str, float]] = {}
        self.sent: dict[int, tuple[int, float]] = {}  # client -> (round, time) of its unanswered train task
        self.missed: dict[int, int] = {}  # client -> the round whose deadline it missed while still computing
        self.wasted = {"updates": 0, "cpu_s": 0.0, "train_s": 0.0}

    def joined(self, cid: int) -> None:
        """A new stream: whatever task the old one carried is gone, and so is its heartbeat history."""
        self.sent.pop(cid, None)
        self.missed.pop(cid, None)
        self.heard.pop(cid, None)

    def heartbeat(self, cid: int, now: float, message: dict) -> None:
        self.heard[cid] = now
        self.resources[cid] = {k: float(v) for k in HEARTBEAT_FIELDS
                               if isinstance(v := message.get(k), int | float) and math.isfinite(v)}

    def message(self, cid: int, now: float) -> None:
        """Any message (an update too) shows the client alive: a long training leaves no gap in its heartbeats."""
        if cid in self.heard:
            self.heard[cid] = now

    def alive(self, cid: int, now: float) -> bool:
        """Whether a connected client's session shows life: busy with a task, never asked for or not yet past
        its first heartbeat, or heard from within SUPERSEDE_AFTER_S (at least its heartbeat window). Only a
        session silent that long may be superseded by a new one for the same id (its host died unseen)."""
        silent = max(self.every_s * self.misses, SUPERSEDE_AFTER_S)
        return cid in self.sent or self.every_s <= 0 or cid not in self.heard or now - self.heard[cid] <= silent

    def available(self, connected: list[int], now: float) -> list[int]:
        stale = self.every_s * self.misses
        return [cid for cid in sorted(connected) if cid not in self.sent
                and (self.every_s <= 0 or cid not in self.heard or now - self.heard[cid] <= stale)]

    def task_sent(self, cid: int, round_num: int, now: float) -> None:
        self.sent[cid] = (round_num, now)
        self.missed.pop(cid, None)

    def timed(self, cid: int, round_num: int, metrics: Any, now: float) -> Any:
        """The metrics of an update for its own round, plus the server's `received_s` and `comm_time_s`."""
        sent = self.sent.get(cid)
        if sent is None or sent[0] != round_num:
            return metrics
        del self.sent[cid]
        if not isinstance(metrics, dict):
            return metrics
        received = now - sent[1]
        return {**metrics, "received_s": received, "comm_time_s": max(received - _seconds(metrics.get("local_s")), 0.0)}

    def round_closed(self, round_num: int, failed: list[int]) -> None:
        """Failed clients that still hold the round's task were cut by the deadline: their answer will be late."""
        for cid in failed:
            if self.sent.get(cid, (None,))[0] == round_num:
                self.missed[cid] = round_num

    def late(self, cid: int, round_num: int, metrics: Any, now: float) -> float | None:
        """If this is the answer to a round whose deadline the client missed: counted as wasted, and its
        round trip on the server's clock returned (the latency the deadline hid). Else None."""
        if self.missed.get(cid) != round_num:
            return None
        del self.missed[cid]
        sent = self.sent.pop(cid, None)
        metrics = metrics if isinstance(metrics, dict) else {}
        self.wasted["updates"] += 1
        self.wasted["cpu_s"] += _seconds(metrics.get("cpu_time_s"))
        self.wasted["train_s"] += _seconds(metrics.get("train_time_s"))
        return now - sent[1] if sent is not None and sent[0] == round_num else None
