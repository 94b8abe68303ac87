"""The training-backend seam: tasks and results are plain picklable data, results are a pure function of
the task, and a simulation gives the same job whatever order a backend finishes its tasks in."""
from __future__ import annotations

import pickle
import random

import numpy as np

from mlsyskit.core.storage import MetaStore
from mlsyskit.tools.fl.backend_choice import make_backend
from mlsyskit.tools.fl.backends import InProcessBackend, RoundJob, TrainTask, run_train_task
from mlsyskit.tools.fl.config import DataSpec, JobConfig, TrainSpec
from mlsyskit.tools.fl.data import load_federated
from mlsyskit.tools.fl.model import init_weights
from mlsyskit.tools.fl.simulator import Simulation


def _round(clients: int = 4):
    data = load_federated(DataSpec(num_clients=clients, seed=3))
    spec = TrainSpec(epochs=1)
    job = RoundJob(init_weights(data.num_features, data.num_classes, spec.hidden, 7), spec, data.num_features,
                   data.num_classes)
    tasks = [TrainTask(cid, data.clients[cid], 100 + cid, "label-flip" if cid == 2 else "none")
             for cid in range(clients)]
    return job, tasks


def _same(a, b) -> bool:
    return (a.num_samples, a.loss, a.quality, a.consumer_accuracy) == (b.num_samples, b.loss, b.quality,
                                                                        b.consumer_accuracy) and \
        all(np.array_equal(a.weights[k], b.weights[k]) for k in a.weights)


def test_tasks_and_results_survive_pickling_and_give_the_same_result():
    job, tasks = _round()
    results = InProcessBackend().train(job, tasks)
    assert [r.num_samples for r in results] == [t.data.num_samples for t in tasks]  # task order
    shipped_job, shipped = pickle.loads(pickle.dumps((job, tasks)))
    again = [pickle.loads(pickle.dumps(run_train_task(shipped_job, t))) for t in shipped]
    assert all(_same(a, b) for a, b in zip(results, again, strict=True))
    assert not _same(results[0], results[2])  # the attacker's differs: the task, not the slot, decides


class ShuffledBackend(InProcessBackend):
    """Runs the tasks in a seeded shuffled order (as remote workers finish in any order), returns task order."""

    name = "shuffled"

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def train(self, job, tasks):
        order = list(range(len(tasks)))
        self.rng.shuffle(order)
        done = {i: run_train_task(job, tasks[i]) for i in order}
        return [done[i] for i in range(len(tasks))]


def test_simulation_does_not_depend_on_the_order_tasks_finish():
    config = JobConfig(strategy="tiff", rounds=3, per_round=4, seed=2, data=DataSpec(num_clients=8, seed=2))
    logs = []
    for backend in (InProcessBackend(), ShuffledBackend(1), ShuffledBackend(2)):
        with MetaStore(":memory:") as store:
            sim = Simulation(config, store, {3: "label-flip"}, backend=backend)
            sim.run()
            logs.append((store.read_log("fl_rounds"), sim.coordinator.ledger.digest()))
    assert logs[0] == logs[1] == logs[2]


def test_unknown_backend_is_refused_naming_the_choices():
    try:
        make_backend("mpi")
    except ValueError as e:
        assert "inprocess" in str(e) and "ray" in str(e)
    else:
        raise AssertionError("an unknown backend was accepted")
