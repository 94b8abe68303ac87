"""The scheduling harness's population: `fl-server simulate`'s round model over a learning curve.

`CurvePopulation` stands where a simulation's FederatedData stands (sizes, the server's side, the
clients by id) and `CurveBackend` where a training backend does: an on-time update advances the
synthetic learning curve (learning_model.py) instead of training a model, and reports the curve's
loss and accuracy for the client. Everything else (selection, deadlines, drops, late updates,
wasted work, the ledger) is the simulator's and the Coordinator's own code.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from mlsyskit.core.storage import MetaStore
from mlsyskit.tools.fl.backends import BaselineTask, RoundJob, TrainTask
from mlsyskit.tools.fl.config import JobConfig, TrainSpec
from mlsyskit.tools.fl.model import Weights
from mlsyskit.tools.fl.scheduling.learning_model import LearningCurve
from mlsyskit.tools.fl.selection.base import Selector
from mlsyskit.tools.fl.sim_world import World
from mlsyskit.tools.fl.simulator import Simulation, SimulationOptions
from mlsyskit.tools.fl.task import ClientData, ServerData
from mlsyskit.tools.fl.training import LocalResult

_NO_X, _NO_Y = np.zeros((0, 1), np.float32), np.zeros(0, np.int64)


class _Clients(Sequence):
    """Client ids as (empty) ClientData: the curve, not arrays, says what a client's data are."""

    def __init__(self, count: int) -> None:
        self.count = count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, cid):  # type: ignore[override]
        return ClientData(int(cid), _NO_X, _NO_Y, _NO_X, _NO_Y)


class CurvePopulation:
    num_features, num_classes = 1, 2

    def __init__(self, curve: LearningCurve, clients: int, per_round: int) -> None:
        self.curve, self.per_round = curve, per_round
        self.clients = _Clients(clients)
        self.shares = [0.0] * curve.config.groups
        for cid in range(clients):
            self.shares[curve.group(cid)] += 1 / clients

    def partition_sizes(self) -> tuple[int, ...]:
        return tuple(self.curve.samples(c) for c in range(len(self.clients)))

    def evaluate(self, weights: Weights) -> dict[str, float]:
        accuracy = self.curve.global_accuracy(self.shares)
        return {"accuracy": accuracy, "val_accuracy": accuracy, "loss": -math.log(max(accuracy, 1e-3))}

    def server_side(self) -> ServerData:
        return ServerData(self.num_features, self.num_classes, _NO_X, _NO_Y, _NO_X, _NO_Y, self.evaluate)


class CurveBackend:
    """'Training' = the curve's view of the client before the round's updates, then the updates applied."""

    name = "curve"

    def __init__(self, population: CurvePopulation) -> None:
        self.population = population

    def train(self, job: RoundJob, tasks: Sequence[TrainTask]) -> list[LocalResult]:
        curve = self.population.curve
        results = []
        for task in tasks:
            accuracy = curve.client_accuracy(task.client_id)
            results.append(LocalResult(job.weights, curve.samples(task.client_id), curve.loss(task.client_id)[0],
                                       accuracy, 0.0, 0.0, accuracy))
        curve.apply([(r_task.client_id, r.num_samples) for r_task, r in zip(tasks, results, strict=True)],
                    self.population.per_round)
        return results

    def local_only(self, spec: TrainSpec, num_features: int, num_classes: int,
                   tasks: Sequence[BaselineTask]) -> list[float]:
        return [0.0 for _ in tasks]  # the curve has no local-only model; refunds do not matter here

    def close(self) -> None:
        pass


class CurveSimulation(Simulation):
    def __init__(self, config: JobConfig, store: MetaStore, population: CurvePopulation, world: World,
                 scheduler: Selector, options: SimulationOptions, model_bytes: int) -> None:
        super().__init__(config, store, backend=CurveBackend(population), options=options, data=population,
                         world=world, scheduler=scheduler)
        self.population = population
        self.model_bytes = model_bytes  # the modelled model's size, not the stand-in weights'

    def client_accuracies(self, clients: list[int], weights: Weights) -> dict[int, float]:
        return {cid: self.population.curve.client_accuracy(cid) for cid in clients}
