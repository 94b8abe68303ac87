"""Where simulated clients train: the seam between the simulator and a training backend.

The simulator decides who trains, with which model and seed, and when each update would arrive
on the virtual clock; a backend only runs the training. `InProcessBackend` trains the tasks one
after another in this process; a distributed backend (`--backend ray`) runs the same tasks as
remote tasks and must return the same results.

The contract, so that any backend gives the same job for the same seed:
- Tasks and results are plain data that pickle: numpy arrays, ints, floats, strings and frozen
  dataclasses of them (`ClientData`, `TrainSpec`, `LocalResult`). No torch objects, no handles.
- A task carries everything its training depends on (model weights, data, spec, seed, attack),
  so the result is a pure function of the task; a worker keeps no state between tasks.
- `train` returns one result per task, in the order of the tasks, whatever order they finish in.
- The measured wall/CPU times in a result are this machine's and differ between backends; the
  simulator replaces them with the client's profile on the virtual clock.

Training needs torch, which takes seconds of CPU to import: the training modules are imported when a
task first runs, so that `fl-server` commands that train nothing (run, partition, report, certs)
start without it.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from mlsyskit.tools.fl.config import TrainSpec
from mlsyskit.tools.fl.model import Weights
from mlsyskit.tools.fl.task import ClientData

if TYPE_CHECKING:
    from mlsyskit.tools.fl.training import LocalResult


@dataclass(frozen=True)
class RoundJob:
    """What every task of one round shares: the global model and the training recipe."""

    weights: Weights
    spec: TrainSpec
    num_features: int
    num_classes: int


@dataclass(frozen=True)
class TrainTask:
    """One selected client's local training in one round."""

    client_id: int
    data: ClientData
    seed: int
    attack: str = "none"


@dataclass(frozen=True)
class BaselineTask:
    """One consumer's local-only baseline (TIFF's utility ratio): a model trained on its data alone."""

    client_id: int
    data: ClientData
    seed: int


class TrainingBackend(Protocol):
    name: str

    def train(self, job: RoundJob, tasks: Sequence[TrainTask]) -> list[LocalResult]:
        """One result per task, in task order."""
        ...

    def local_only(self, spec: TrainSpec, num_features: int, num_classes: int,
                   tasks: Sequence[BaselineTask]) -> list[float]:
        """Each task's local-only accuracy on its own test split, in task order."""
        ...

    def close(self) -> None: ...


def run_train_task(job: RoundJob, task: TrainTask) -> LocalResult:
    """The one function every backend runs per task (a Ray backend ships exactly this)."""
    from mlsyskit.tools.fl.training import train_local  # torch: imported by the first task

    return train_local(job.weights, task.data, job.spec, job.num_features, job.num_classes, task.seed, task.attack)


def run_baseline_tasks(spec: TrainSpec, num_features: int, num_classes: int,
                       tasks: Sequence[BaselineTask]) -> list[float]:
    """What every backend runs for a group of baselines: the built-in MLP's all at once (baseline.py; each
    client's result does not depend on the group), a custom model's one by one in torch."""
    from mlsyskit.tools.fl.baseline import local_only_accuracies  # torch: imported by the first task
    from mlsyskit.tools.fl.training import local_only_accuracy

    if not spec.model:
        return local_only_accuracies([t.data for t in tasks], [t.seed for t in tasks], spec, num_features, num_classes)
    return [local_only_accuracy(t.data, spec, num_features, num_classes, t.seed) for t in tasks]


class InProcessBackend:
    """Trains the tasks sequentially in this process (torch single-threaded: many tiny models)."""

    name = "inprocess"

    def train(self, job: RoundJob, tasks: Sequence[TrainTask]) -> list[LocalResult]:
        return [run_train_task(job, task) for task in tasks]

    def local_only(self, spec: TrainSpec, num_features: int, num_classes: int,
                   tasks: Sequence[BaselineTask]) -> list[float]:
        return run_baseline_tasks(spec, num_features, num_classes, tasks)

    def close(self) -> None:
        pass
