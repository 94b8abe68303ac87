"""What schedulers read from a round's reports: one place that knows the metric names.

A report (real `fl-client` or simulated) carries `train_time_s`, `cpu_time_s`, `num_samples`,
`loss`, and optionally `comm_time_s` (upload + download), `accuracy` (the global model's accuracy
on the client's data before it trained; falls back to the update's quality) and `loss_sq_mean`
(mean squared per-sample loss for Oort; falls back to loss ** 2). A report with status `failed`
and `deadline` in its reason (the coordinator writes "no update before the deadline") arrived too
late or never: its latency is at least the round's deadline (`global_metrics["deadline_s"]`, else
the round's duration). A client could claim to be fast to be picked more; when the server records
`received_s` (seconds from sending the round's task to receiving the update, its own clock), the
latency is at least that.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from mlsyskit.tools.fl.outcome import ClientReport, RoundOutcome


@dataclass(frozen=True)
class ClientSignal:
    client_id: int
    latency_s: float | None  # None: the client failed without telling how long it took
    cpu_s: float
    samples: int
    accuracy: float | None
    loss_sq_mean: float | None
    late: bool


def _finite(value: object) -> float | None:
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) and number >= 0 else None


def signal(report: ClientReport, deadline_s: float | None = None) -> ClientSignal:
    m = report.metrics
    train, comm = _finite(m.get("train_time_s")), _finite(m.get("comm_time_s", 0.0)) or 0.0
    late = report.status == "failed" and "deadline" in report.reason
    latency = train + comm if train is not None else None
    received = _finite(m.get("received_s"))
    if received is not None:  # the server's own clock bounds what the client claims from below
        latency = max(latency or 0.0, received)
    if late and deadline_s is not None:
        latency = max(latency or 0.0, deadline_s)
    accuracy = _finite(m.get("accuracy"))
    if accuracy is not None and accuracy > 1:
        accuracy = None  # out of range: ignored, never clipped into a plausible value
    elif "accuracy" not in m and report.status == "valid":
        accuracy = report.pay_quality
    loss = _finite(m.get("loss"))
    loss_sq = _finite(m.get("loss_sq_mean"))
    if loss_sq is None and loss is not None:
        loss_sq = loss * loss
    return ClientSignal(report.client_id, latency, _finite(m.get("cpu_time_s")) or 0.0,
                        report.num_samples, accuracy, loss_sq, late)


def signals(outcome: RoundOutcome) -> list[ClientSignal]:
    deadline = _finite(outcome.global_metrics.get("deadline_s")) or _finite(outcome.duration_s) or None
    return [signal(r, deadline) for _, r in sorted(outcome.reports.items())]
