"""Accuracy trend: per-tier accuracy and its slope over a window, and a global plateau detector."""
from __future__ import annotations

from collections import deque
from typing import Any

from mlsyskit.core.config import require


def slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of y over x; 0 with fewer than two distinct x."""
    if len(points) < 2:
        return 0.0
    mx = sum(x for x, _ in points) / len(points)
    my = sum(y for _, y in points) / len(points)
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if sxx == 0:
        return 0.0
    return sum((x - mx) * (y - my) for x, y in points) / sxx


class TierAccuracy:
    """The latest `window` (round, accuracy) points per tier."""

    def __init__(self, window: int = 5) -> None:
        require(window >= 2, "trend window must be >= 2")
        self.window = window
        self.history: dict[int, deque[tuple[float, float]]] = {}

    def record(self, round_num: int, tier: int, accuracy: float) -> None:
        self.history.setdefault(tier, deque(maxlen=self.window)).append((float(round_num), float(accuracy)))

    def accuracy(self, tier: int) -> float | None:
        points = self.history.get(tier)
        return points[-1][1] if points else None

    def slope(self, tier: int) -> float:
        return slope(list(self.history.get(tier, ())))

    def state_dict(self) -> dict[str, Any]:
        return {str(t): [list(p) for p in pts] for t, pts in self.history.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.history = {int(t): deque((tuple(p) for p in pts), maxlen=self.window) for t, pts in state.items()}


PLATEAU_RULES = ("best", "mean")


class PlateauDetector:
    """Plateau, rule "best": the best accuracy of the last `window` rounds beats the best before by < `min_gain`;
    rule "mean": the mean of the last `window` rounds beats the mean of the `window` before by < `min_gain`.
    "best" compares against one round's spike, so on a noisy curve (MNIST-1D: +-0.05 from round to round)
    it fires every window while accuracy still climbs; "mean" needs the climb itself to stop."""

    def __init__(self, window: int = 5, min_gain: float = 0.005, rule: str = "best") -> None:
        require(window >= 1 and min_gain >= 0, "plateau window >= 1 and min_gain >= 0")
        require(rule in PLATEAU_RULES, f"plateau rule must be one of {PLATEAU_RULES}")
        self.window, self.min_gain, self.rule = window, min_gain, rule
        self.values: list[float] = []

    def record(self, accuracy: float) -> None:
        self.values.append(float(accuracy))

    def plateaued(self) -> bool:
        w = self.window
        if self.rule == "mean":
            if len(self.values) < 2 * w:
                return False
            return (sum(self.values[-w:]) - sum(self.values[-2 * w:-w])) / w < self.min_gain
        if len(self.values) <= w:
            return False
        return max(self.values[-w:]) - max(self.values[:-w]) < self.min_gain

    def state_dict(self) -> dict[str, Any]:
        return {"values": list(self.values)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.values = [float(v) for v in state["values"]]
