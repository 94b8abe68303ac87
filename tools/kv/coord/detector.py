"""A pure heartbeat failure detector: nodes report, time passes, nodes are suspected after missed beats.

No I/O and no wall time: the caller passes `now` (from an injected Clock) to every call, so the
same object runs in the coordinator process and in virtual-time tests. A node is failed once its
silence exceeds the failure timeout: `misses` whole heartbeat intervals, but never less than
`min_timeout_s`, by default MIN_BEATS (8) intervals: 0.5 s x 3 beats, floored at 4 s.

Why 4 s (issue 22): with 1.5 s, a loaded 2-core host (load 7-23) failed healthy nodes over 3 times
in 100k pipelined GETs, because one event-loop turn or a scheduler delay starved the beats. Beats
now come from their own thread (node/beat.py), so what remains is the host's scheduling delay and
GIL hand-off, well under a second even at load 20; 4 s leaves 3.5 s of margin above one interval
and still detects a kill -9 within 5 s: silence starts at the last beat (at most one interval
before the kill counts towards the timeout, never after it) and the coordinator checks every
interval / 2, so a dead node is failed at most 4 s + 0.25 s after it died. Redis Cluster's node
timeout is 15 s. The floor scales with the interval, so a cluster (or test) that asks for fast
beats still gets fast detection (0.2 s beats: 1.6 s); `min_timeout_s=0` keeps interval x misses.
The nodes' leases use the same timeout (spec.CoordinatorSpec.timeout_s): a node stops serving
before the coordinator can fail it over.

The detector also watches itself: if `expire` was not called for longer than the timeout (the
coordinator was paused, e.g. SIGSTOP or a long GC, or starved on a loaded machine), silence says
nothing about the nodes, so the stall is not counted against them: every node's silence grows by
one interval only, not by the whole stall, and that check gives no verdict. Silence still
accumulates across stalls, and after `misses` stalled checks in a row the detector judges anyway,
so a coordinator that is starved all the time still fails a dead node over (after about `misses`
more checks) instead of never.
"""
from __future__ import annotations

from dataclasses import dataclass

from mlsyskit.core.config import require

MIN_BEATS = 8  # the failure timeout's default floor, in intervals (see above): 4 s at 0.5 s beats


def failure_timeout(interval_s: float, misses: int, min_timeout_s: float | None) -> float:
    """The one rule for how long a node may be silent: the coordinator's detector and the node's
    lease (spec.CoordinatorSpec) both use it, so a node's lease never outlives it.
    min_timeout_s None: MIN_BEATS intervals."""
    return max(interval_s * misses, MIN_BEATS * interval_s if min_timeout_s is None else min_timeout_s)


@dataclass(frozen=True)
class DetectorConfig:
    interval_s: float = 0.5   # how often nodes beat
    misses: int = 3           # beats missed before a node counts as failed
    min_timeout_s: float | None = None  # ... but never less silence than this (None: MIN_BEATS intervals)

    def __post_init__(self) -> None:
        require(self.interval_s > 0, f"heartbeat interval must be positive, got {self.interval_s}")
        require(self.misses >= 1, f"misses must be at least 1, got {self.misses}")
        require(self.min_timeout_s is None or self.min_timeout_s >= 0,
                f"min timeout must be >= 0, got {self.min_timeout_s}")

    @property
    def timeout_s(self) -> float:
        return failure_timeout(self.interval_s, self.misses, self.min_timeout_s)


class FailureDetector:
    """Tracks the last beat of each watched node; `expire(now)` reports each failure exactly once."""

    def __init__(self, config: DetectorConfig | None = None) -> None:
        self.config = config or DetectorConfig()
        self._last: dict[str, float] = {}
        self._failed: set[str] = set()
        self._last_check: float | None = None
        self._stalls = 0   # times the caller itself was too slow to judge the nodes
        self._stalled_in_row = 0

    def watch(self, node_id: str, now: float) -> None:
        """Start watching a node as if it had just beaten (a grace period after join or takeover)."""
        self._last[node_id] = now
        self._failed.discard(node_id)
        if self._last_check is None:
            self._last_check = now   # judging starts now: a pause before the first check is a stall too

    def forget(self, node_id: str) -> None:
        self._last.pop(node_id, None)
        self._failed.discard(node_id)

    def beat(self, node_id: str, now: float) -> bool:
        """Record a heartbeat. Returns False for a node already declared failed: it stays failed
        (it has been, or is being, deposed) until the caller watches it again after it rejoins."""
        if node_id in self._failed:
            return False
        if node_id not in self._last or now > self._last[node_id]:
            self._last[node_id] = now
        return True

    def expire(self, now: float) -> list[str]:
        """Nodes whose silence just exceeded the timeout, sorted; each is reported once."""
        gap = 0.0 if self._last_check is None else now - self._last_check
        self._last_check = now
        if gap > self.config.timeout_s:
            self._stalls += 1
            self._stalled_in_row += 1
            excess = gap - self.config.interval_s  # the stall beyond one ordinary interval is nobody's silence
            for node_id, t in self._last.items():
                self._last[node_id] = min(now, t + excess)
            if self._stalled_in_row < self.config.misses:
                return []
        else:
            self._stalled_in_row = 0
        deadline = now - self.config.timeout_s
        newly = sorted(n for n, t in self._last.items() if n not in self._failed and t < deadline)
        self._failed.update(newly)
        return newly

    @property
    def stalls(self) -> int:
        return self._stalls

    def alive(self, now: float) -> list[str]:
        deadline = now - self.config.timeout_s
        return sorted(n for n, t in self._last.items() if n not in self._failed and t >= deadline)

    def failed(self) -> list[str]:
        return sorted(self._failed)

    def silence(self, node_id: str, now: float) -> float | None:
        """Seconds since the node's last beat (None if not watched)."""
        t = self._last.get(node_id)
        return None if t is None else now - t
