"""A virtual-clock harness: schedulers over simulated heterogeneous clients and a model curve.

It runs the one round model of `fl-server simulate` (simulator.Simulation driving the Coordinator:
begin_round's selection and deadline rule, sim_world's fates: who drops when it goes offline, whose
update comes after the deadline, what compute was wasted) with two things swapped for speed: the
population is a synthetic learning curve (learning_model.py: a model for checking the direction of
knobs, not real training) and "training" an on-time update advances that curve (CurveBackend).
The global accuracy each round and every client's accuracy at the end are the curve's.
Everything is seeded: the same seed gives the same selection trace and results.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mlsyskit.core.config import require
from mlsyskit.core.storage import MetaStore
from mlsyskit.tools.fl.config import DataSpec, JobConfig, TrainSpec
from mlsyskit.tools.fl.scheduling import metrics
from mlsyskit.tools.fl.scheduling.availability import AlwaysAvailable, Availability
from mlsyskit.tools.fl.scheduling.curve_sim import CurvePopulation, CurveSimulation
from mlsyskit.tools.fl.scheduling.learning_model import CurveConfig, LearningCurve
from mlsyskit.tools.fl.scheduling.resources import ResourceModel
from mlsyskit.tools.fl.selection.base import Selector
from mlsyskit.tools.fl.sim_world import World, WorldConfig
from mlsyskit.tools.fl.simulator import SimulationOptions


@dataclass(frozen=True)
class HarnessConfig:
    clients: int = 100
    per_round: int = 10
    rounds: int = 50
    epochs: int = 1
    model_bytes: int = 400_000
    deadline_s: float | None = None  # None: the scheduler's own round_deadline capped by max_round_s
    max_round_s: float = 3600.0  # the hard timeout (the job's round_timeout_s)

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
    world = World(WorldConfig(), seed, resources or ResourceModel(seed), availability or AlwaysAvailable())
    curve = LearningCurve(curve_config or CurveConfig(), world.resources, seed)
    population = CurvePopulation(curve, config.clients, config.per_round)
    job = JobConfig(strategy="fedavg", rounds=config.rounds, per_round=config.per_round, seed=seed,
                    round_timeout_s=config.max_round_s, data=DataSpec(num_clients=config.clients, seed=seed),
                    train=TrainSpec(epochs=config.epochs, hidden=1))
    options = SimulationOptions(deadline_s=config.deadline_s, eval_clients=config.clients)
    store = MetaStore(":memory:")
    try:
        simulation = CurveSimulation(job, store, population, world, scheduler, options, config.model_bytes)
        outcome = simulation.run()
    finally:
        store.close()
    result = HarnessResult(population=config.clients)
    now = 0.0
    for o in outcome.outcomes:
        now += o.duration_s
        result.round_end_s.append(now)
        result.accuracy.append(float(o.global_metrics["accuracy"]))
        result.selections.append(list(o.selected))
        for cid in o.selected:
            result.participation[cid] = result.participation.get(cid, 0) + 1
        for cid, report in o.reports.items():
            cpu = float(report.metrics.get("cpu_time_s", 0.0))
            result.cpu_s[cid] = result.cpu_s.get(cid, 0.0) + cpu
            if report.status == "failed" and cpu > 0:
                result.wasted_cpu_s[cid] = result.wasted_cpu_s.get(cid, 0.0) + cpu
    result.client_accuracy = [outcome.client_accuracy[c] for c in range(config.clients)]
    return result
