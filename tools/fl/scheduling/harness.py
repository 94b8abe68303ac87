"""A virtual-clock harness: schedulers over simulated heterogeneous clients and a model curve.

Each round: the clients online at the round's start (availability) are offered to the scheduler;
each selected client's compute and communication time come from its resource profile at that
moment (slowdowns included); a client that goes offline before it finishes is `failed/offline`
(the server sees the drop at once, as the real server marks a dropped stream), one that finishes
after the round's deadline is `failed/deadline`, and both have their compute counted as wasted
work. The round lasts until the last on-time update or drop, or the deadline when someone missed
it. On-time updates advance the synthetic learning curve (learning_model.py: a
model for checking the direction of knobs, not real training). Everything is seeded: the same
seed gives the same selection trace and results.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from mlsyskit.core.config import require
from mlsyskit.core.sim import sub_seed
from mlsyskit.tools.fl.outcome import ClientReport, RoundOutcome
from mlsyskit.tools.fl.scheduling import metrics
from mlsyskit.tools.fl.scheduling.availability import AlwaysAvailable, Availability
from mlsyskit.tools.fl.scheduling.learning_model import CurveConfig, LearningCurve
from mlsyskit.tools.fl.scheduling.resources import ResourceModel
from mlsyskit.tools.fl.selection.base import Selector


@dataclass(frozen=True)
class HarnessConfig:
    clients: int = 100
    per_round: int = 10
    rounds: int = 50
    epochs: int = 1
    model_bytes: int = 400_000
    deadline_s: float | None = None  # None: the scheduler's own round_deadline, else wait for all
    max_round_s: float = 3600.0  # a round never waits longer (the hard timeout)

    def __post_init__(self) -> None:
        require(self.clients >= 1 and 1 <= self.per_round and self.rounds >= 1, "clients, per_round, rounds >= 1")
        require(self.deadline_s is None or self.deadline_s > 0, "deadline_s must be positive")


@dataclass
class HarnessResult:
    round_end_s: list[float] = field(default_factory=list)
    accuracy: list[float] = field(default_factory=list)
    selections: list[list[int]] = field(default_factory=list)
    participation: dict[int, int] = field(default_factory=dict)
    cpu_s: dict[int, float] = field(default_factory=dict)
    wasted_cpu_s: dict[int, float] = field(default_factory=dict)
    client_accuracy: list[float] = field(default_factory=list)
    population: int = 0

    def summary(self, target: float | None = None) -> dict[str, Any]:
        durations = [b - a for a, b in zip([0.0, *self.round_end_s], self.round_end_s, strict=False)]
        out: dict[str, Any] = {
            "final_accuracy": self.accuracy[-1] if self.accuracy else None,
            "sim_time_s": self.round_end_s[-1] if self.round_end_s else 0.0,
            "mean_round_s": sum(durations) / len(durations) if durations else 0.0,
            "participation_jain": metrics.jain_index(metrics.per_client(self.population, self.participation)),
            "cpu_jain": metrics.jain_index(metrics.per_client(self.population, self.cpu_s)),
            **metrics.work_totals(self.cpu_s, self.wasted_cpu_s),
            **{f"client_accuracy_{k}": v for k, v in metrics.accuracy_spread(self.client_accuracy).items()},
        }
        if target is not None:
            out["time_to_target_s"] = metrics.time_to_accuracy(self.round_end_s, self.accuracy, target)
        return out


def run(scheduler: Selector, config: HarnessConfig, seed: int, resources: ResourceModel | None = None,
        availability: Availability | None = None, curve_config: CurveConfig | None = None) -> HarnessResult:
    resources = resources or ResourceModel(seed)
    availability = availability or AlwaysAvailable()
    curve = LearningCurve(curve_config or CurveConfig(), resources, seed)
    shares = [0.0] * curve.config.groups
    for cid in range(config.clients):
        shares[curve.group(cid)] += 1 / config.clients
    result = HarnessResult(population=config.clients)
    now = 0.0
    for round_num in range(1, config.rounds + 1):
        available = [c for c in range(config.clients) if availability.is_active(c, now)]
        rng = random.Random(sub_seed(seed, f"fl-sched/select/{round_num}"))
        selected = scheduler.select(round_num, available, config.per_round, rng) if available else []
        proposed = getattr(scheduler, "round_deadline", None)
        deadline = config.deadline_s or (proposed(selected) if proposed and selected else None) or config.max_round_s
        deadline = min(deadline, config.max_round_s)
        cost_rng = random.Random(sub_seed(seed, f"fl-sched/cost/{round_num}"))
        reports, updates, last_event, missed = {}, [], 0.0, False
        for cid in selected:
            samples = curve.samples(cid)
            measured = resources.measured(cid, now, samples, config.epochs, config.model_bytes, cost_rng)
            compute, comm = measured["train_time_s"], measured["comm_time_s"]
            loss, loss_sq = curve.loss(cid)
            m = {"num_samples": samples, "loss": loss, "loss_sq_mean": loss_sq, "quality": curve.client_accuracy(cid),
                 "accuracy": curve.client_accuracy(cid), **measured}
            offline_at = availability.online_until(cid, now) - now
            result.cpu_s[cid] = result.cpu_s.get(cid, 0.0) + min(compute, offline_at)
            if compute + comm > offline_at:
                reports[cid] = ClientReport(cid, m, status="failed", reason="offline before it finished")
                result.wasted_cpu_s[cid] = result.wasted_cpu_s.get(cid, 0.0) + min(compute, offline_at)
                last_event = max(last_event, min(offline_at, deadline))  # the server sees the drop at once
            elif compute + comm > deadline:
                reports[cid] = ClientReport(cid, m, status="failed", reason=f"deadline {deadline:.1f}s missed")
                result.wasted_cpu_s[cid] = result.wasted_cpu_s.get(cid, 0.0) + compute
                missed = True
            else:
                reports[cid] = ClientReport(cid, m, aggregated=True)
                updates.append((cid, samples))
                last_event = max(last_event, compute + comm)
            result.participation[cid] = result.participation.get(cid, 0) + 1
        curve.apply(updates, config.per_round)
        duration = deadline if missed or not selected else last_event
        now += duration
        accuracy = curve.global_accuracy(shares)
        scheduler.observe(RoundOutcome(round_num, selected, reports, {"accuracy": accuracy, "deadline_s": deadline},
                                       duration_s=duration))
        result.round_end_s.append(now)
        result.accuracy.append(accuracy)
        result.selections.append(list(selected))
    result.client_accuracy = [curve.client_accuracy(c) for c in range(config.clients)]
    return result
