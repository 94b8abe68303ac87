"""A pure heartbeat failure detector: nodes report, time passes, nodes are suspected after missed beats.

No I/O and no wall time: the caller passes `now` (from an injected Clock) to every call, so the
same object runs in the coordinator process and in virtual-time tests. A node is failed once
`misses` whole heartbeat intervals have passed since its last beat (default 0.5 s x 3 = 1.5 s).

The detector also watches itself: if `expire` was not called for longer than the timeout (the
coordinator was paused, e.g. SIGSTOP or a long GC), silence says nothing about the nodes, so
every watched node gets a fresh grace period instead of being failed all at once.
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
        stalled = self._last_check is not None and now - self._last_check > self.config.timeout_s
        self._last_check = now
        if stalled:
            self._stalls += 1
            for node_id in self._last:
                self._last[node_id] = max(self._last[node_id], now)
            return []
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
