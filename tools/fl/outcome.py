"""What one round produced, as plain data shared by selectors, incentives and the report."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class ClientReport:
    """A provider's reply in one round: its metrics and what the server decided about it."""

    client_id: int
    metrics: dict[str, float]
    status: str = "valid"  # valid | rejected | failed
    reason: str = ""
    aggregated: bool = False
    verified_quality: float | None = None  # the server's own score of the update (None: not verified)

    @property
    def quality(self) -> float:
        """The quality the provider claimed."""
        return float(self.metrics.get("quality", 0.0))

    @property
    def pay_quality(self) -> float:
        """What selection, the quality floor and pay use: the verified quality when the server measured one."""
        return self.quality if self.verified_quality is None else self.verified_quality

    @property
    def num_samples(self) -> int:
        return int(self.metrics.get("num_samples", 0))


@dataclass
class RoundOutcome:
    round: int
    selected: list[int]
    reports: dict[int, ClientReport] = field(default_factory=dict)
    global_metrics: dict[str, float] = field(default_factory=dict)
    duration_s: float = 0.0
    phases: dict[str, float] = field(default_factory=dict)  # wall seconds per phase (real transport only)
    pay_by_quality: bool = True  # False: the global model did not beat chance yet, so pay was equal

    def with_status(self, status: str) -> list[ClientReport]:
        return [r for cid, r in sorted(self.reports.items()) if r.status == status]

    def to_record(self) -> dict[str, Any]:
        return {"round": self.round, "selected": self.selected, "duration_s": self.duration_s,
                "global": self.global_metrics,
                "pay_by_quality": self.pay_by_quality,
                "reports": {str(cid): {"metrics": r.metrics, "status": r.status, "reason": r.reason,
                                       "aggregated": r.aggregated, "verified_quality": r.verified_quality}
                            for cid, r in sorted(self.reports.items())},
                **({"phases": self.phases} if self.phases else {})}
