"""A pure heartbeat failure detector: nodes report, time passes, nodes are suspected after missed beats.

No I/O and no wall time: the caller passes `now` (from an injected Clock) to every call, so the
same object runs in the coordinator process and in virtual-time tests. A node is failed once
`misses` whole heartbeat intervals have passed since its last beat (default 0.5 s x 3 = 1.5 s).

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


@dataclass(frozen=True)
class DetectorConfig:
    interval_s: float = 0.5   # how often nodes beat
    misses: int = 3           # beats missed before a node counts as failed

    def __post_init__(self) -> None:
        require(self.interval_s > 0, f"heartbeat interval must be positive, got {self.interval_s}")
        require(self.misses >= 1, f"misses must be at least 1, got {self.misses}")

    @property
    def timeout_s(self) -> float:
        return self.interval_s * self.misses


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
