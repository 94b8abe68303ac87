"""`fl-server simulate`: the real Coordinator with N in-process clients on a virtual clock.

Clients really train (same `train_local` as `fl-client`); only the transport differs: instead
of gRPC, each update is delivered by an event at the virtual time its FLASH-seeded profile
says it would arrive (download + compute + upload). Updates that would arrive after the round
deadline, and clients that drop out (probability `dropout` per selection), are failures, as on
the network. For a given seed the run, and so the ledger, is identical every time.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache

from mlsyskit.core.sim import EventHandle, EventLoop, Seeds
from mlsyskit.core.storage import MetaStore
from mlsyskit.tools.fl.backends import InProcessBackend, RoundJob, TrainingBackend, TrainTask
from mlsyskit.tools.fl.config import DataSpec, JobConfig, TrainSpec
from mlsyskit.tools.fl.coordinator import Coordinator
from mlsyskit.tools.fl.data import load_federated
from mlsyskit.tools.fl.model import evaluate
from mlsyskit.tools.fl.outcome import RoundOutcome
from mlsyskit.tools.fl.profiles import flash_profiles
from mlsyskit.tools.fl.report import SIMULATION_KEY
from mlsyskit.tools.fl.threads import single_threaded
from mlsyskit.tools.fl.training import local_only_accuracy


def choose_attackers(num_clients: int, fraction: float, attack: str, seed: int) -> dict[int, str]:
    """A seeded choice of round(fraction * N) attackers (the simulation's ground truth)."""
    count = int(round(fraction * num_clients))
    chosen = Seeds(seed).random("malicious").sample(range(num_clients), count)
    return {cid: attack for cid in sorted(chosen)}


@lru_cache(maxsize=8192)
def _local_only(data: DataSpec, train: TrainSpec, client_id: int, seed: int) -> float:
    """A consumer's local-only baseline depends only on its data, the TrainSpec and the seed, so simulations of
    the same job with other strategies or attackers (a benchmark sweep) share it instead of retraining."""
    federated = load_federated(data)
    return local_only_accuracy(federated.clients[client_id], train, federated.num_features, federated.num_classes,
                               seed)


@dataclass
class SimulationResult:
    outcomes: list[RoundOutcome] = field(default_factory=list)
    virtual_time_s: float = 0.0


class Simulation:
    def __init__(self, config: JobConfig, store: MetaStore, attacks: dict[int, str] | None = None,
                 dropout: float = 0.0, backend: TrainingBackend | None = None) -> None:
        single_threaded()  # many tiny models: threads cost more than they give
        self.config = config
        self.attacks = attacks or {}
        self.dropout = dropout
        self.backend = backend or InProcessBackend()
        self.loop = EventLoop()
        self.coordinator = Coordinator(config, store)
        self.data = load_federated(config.data)
        self.profiles = flash_profiles(config.data.num_clients, config.seed)
        self.model_bytes = sum(a.nbytes for a in self.coordinator.weights.values())
        self._rng = Seeds(config.seed).numpy("simulation")
        self._deadline: EventHandle | None = None
        self._round_start = 0.0
        self.result = SimulationResult()

    def _register_all(self) -> None:
        c = self.coordinator
        for client in self.data.clients:
            if client.client_id in c.clients:
                continue
            local = _local_only(self.config.data, self.config.train, client.client_id,
                                Seeds(self.config.seed).seed(f"local-only:{client.client_id}") % (2**31))
            c.register(client.client_id, {"num_samples": client.num_samples, "local_only_accuracy": local,
                                          "declared_attack": self.attacks.get(client.client_id, "none")})

    def run(self, on_round: Callable[[RoundOutcome], None] | None = None) -> SimulationResult:
        # the attackers are known here, and only here: the report marks them as ground truth
        self.coordinator.store.put("fl", SIMULATION_KEY, {"attacks": {str(c): a for c, a in self.attacks.items()}})
        self._register_all()
        self._on_round = on_round
        if not self.coordinator.done:
            self.loop.schedule(0.0, self._begin_round)
        self.loop.run()
        self._finish_job()
        self.result.virtual_time_s = self.loop.now()
        return self.result

    def _begin_round(self) -> None:
        c = self.coordinator
        self._round_start = self.loop.now()
        plan = c.begin_round(sorted(c.clients), self._round_start)
        tasks = [TrainTask(cid, self.data.clients[cid], plan.seeds[cid], self.attacks.get(cid, "none"))
                 for cid in plan.selected if self._rng.random() >= self.dropout]  # the rest vanish: failed at the deadline
        job = RoundJob(plan.weights, self.config.train, c.num_features, c.num_classes)
        for task, result in zip(tasks, self.backend.train(job, tasks), strict=True):
            cid = task.client_id
            delay = self.profiles[cid].round_time(self.model_bytes, task.data.num_samples, self.config.train.epochs,
                                                  self._rng)
            if self._round_start + delay <= plan.deadline:
                # virtual, deterministic: the measured wall/CPU times of this process would differ run to run
                metrics = result.metrics() | {"train_time_s": delay, "cpu_time_s": delay, "cpu_percent": 100.0}
                self.loop.schedule(delay, lambda cid=cid, r=result, m=metrics: self._arrive(plan.round, cid, r, m))
        self._deadline = self.loop.schedule_at(plan.deadline, self._end_round)
        if not c.waiting_for():
            self._deadline.cancel()
            self._end_round()

    def _arrive(self, round_num: int, cid: int, result, metrics: dict[str, float]) -> None:
        self.coordinator.submit(cid, round_num, result.weights, metrics)
        if not self.coordinator.waiting_for() and self._deadline is not None:
            self._deadline.cancel()
            self._end_round()

    def _end_round(self) -> None:
        self._deadline = None
        outcome = self.coordinator.finish_round(self.loop.now() - self._round_start)
        self.result.outcomes.append(outcome)
        if self._on_round:
            self._on_round(outcome)
        if not self.coordinator.done:
            self.loop.schedule(0.0, self._begin_round)

    def _finish_job(self) -> None:
        c = self.coordinator
        model = self.config.train.model
        c.finish_job({client.client_id: evaluate(c.kept_weights, client.x_test, client.y_test, model,
                                                 c.num_classes)["accuracy"]
                      for client in self.data.clients})
