"""`fl-server simulate`: the real Coordinator with N in-process clients on a virtual clock.

Clients really train (same `train_local` as `fl-client`, through a training backend:
backends.py); only the transport differs: instead of gRPC, each update is delivered by an event at
the virtual time the client's profile says it would arrive (sim_world.py: download + compute +
upload, slowdowns, availability). A scheduler (`options.scheduler`, scheduling/) may pick the
clients and set each round's deadline. Updates after the deadline, clients that go offline and
clients that drop out (probability `dropout` per selection) are failures, as on the network; late
and offline ones report the compute they wasted. For a given seed the run, and so the ledger, is
identical every time, whatever backend trains.

Scale: nothing per client exists up front. Data are made when a client is selected or evaluated
(synthetic users are lazy; leaf_synthetic.py), profiles and availability are pure functions of
(seed, id), the population registers in one transaction, and a consumer's local-only baseline
(TIFF's refunds) is trained when a reimbursement first needs it. The per-client accuracy at the
end is measured on every client up to `eval_clients`, else on a seeded sample of that many.
"""
from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from mlsyskit.core.sim import EventHandle, EventLoop, Seeds, sub_seed
from mlsyskit.core.storage import MetaStore
from mlsyskit.tools.fl.backends import BaselineTask, InProcessBackend, RoundJob, TrainingBackend, TrainTask
from mlsyskit.tools.fl.config import JobConfig
from mlsyskit.tools.fl.coordinator import Coordinator
from mlsyskit.tools.fl.data import FederatedData, load_federated
from mlsyskit.tools.fl.model import Weights, evaluate, logits
from mlsyskit.tools.fl.outcome import RoundOutcome
from mlsyskit.tools.fl.report import CLIENT_ACCURACY_KEY, SIMULATION_KEY
from mlsyskit.tools.fl.scheduling.hetero import PRESETS, HeteroConfig
from mlsyskit.tools.fl.selection.base import Selector
from mlsyskit.tools.fl.selectors import make_selector
from mlsyskit.tools.fl.sim_world import Fate, World, WorldConfig
from mlsyskit.tools.fl.threads import single_threaded

EVAL_CLIENTS = 200  # default sample of clients scored at the end (each also needs a local-only baseline)
EVAL_CHUNK = 256  # clients scored per pass at the end (and per progress report)
BASELINE_CHUNK = 16  # local-only baselines trained per progress report
EVALUATING, BASELINES = "evaluating clients", "local-only baselines for the refunds"
Progress = Callable[[str, int, int], None]
LATE = "no update before the deadline"  # the coordinator's words for a late update (signals.py reads "deadline")


def choose_attackers(num_clients: int, fraction: float, attack: str, seed: int) -> dict[int, str]:
    """A seeded choice of round(fraction * N) attackers (the simulation's ground truth)."""
    count = int(round(fraction * num_clients))
    chosen = Seeds(seed).random("malicious").sample(range(num_clients), count)
    return {cid: attack for cid in sorted(chosen)}


@dataclass(frozen=True)
class SimulationOptions:
    scheduler: str | None = None  # None: the job's (JobConfig.scheduler; "" = the strategy's own selector)
    weights: dict[str, float] = field(default_factory=dict)  # free knob weights for fast|rfair|afair|perf|adaptive
    scheduler_config: Any = None  # the scheduler's own config dataclass (overrides `weights`)
    deadline_s: float | None = None  # None: the scheduler's round_deadline (capped by round_timeout_s)
    world: WorldConfig = field(default_factory=WorldConfig)
    eval_clients: int = EVAL_CLIENTS  # per-client accuracy at the end: all clients up to this many, else a sample
    time_budget_s: float | None = None  # stop after the first round that ends at or past this simulated time

    def make_scheduler(self) -> Selector | None:
        if self.scheduler is None:
            if self.weights:
                raise ValueError("free weights need a scheduler of ours: " + ", ".join(PRESETS))
            return None
        config = self.scheduler_config
        if config is None and self.weights:
            if self.scheduler not in PRESETS:
                raise ValueError(f"free weights apply to {', '.join(PRESETS)}, not {self.scheduler!r}")
            config = HeteroConfig(preset=self.scheduler, weights=dict(self.weights))
        return make_selector(self.scheduler, config)


_BASELINES: OrderedDict[tuple, float] = OrderedDict()  # local-only accuracy per (data, train, client, seed)
_BASELINE_CACHE = 8192  # a sweep over strategies and attacks of the same job shares them


@dataclass
class SimulationResult:
    outcomes: list[RoundOutcome] = field(default_factory=list)
    virtual_time_s: float = 0.0
    client_accuracy: dict[int, float] = field(default_factory=dict)


class Simulation:
    def __init__(self, config: JobConfig, store: MetaStore, attacks: dict[int, str] | None = None,
                 dropout: float = 0.0, backend: TrainingBackend | None = None,
                 options: SimulationOptions | None = None, *, data: FederatedData | None = None,
                 world: World | None = None, scheduler: Selector | None = None) -> None:
        """`data` (default: config.data partitioned here), `world` (default: options.world) and `scheduler` (an
        instance, default: options') let the scheduling harness run this same round model on its own population."""
        single_threaded()  # many tiny models: threads cost more than they give
        options = options or SimulationOptions()
        scheduler = scheduler or options.make_scheduler()
        if scheduler is not None:  # the job's scheduler: stored with the run, checked on resume
            config = replace(config, scheduler=scheduler.name)
        self.config = config
        self.attacks = attacks or {}
        self.dropout = dropout
        self.backend = backend or InProcessBackend()
        self.options = options
        self.loop = EventLoop()
        self.data = data if data is not None else load_federated(config.data)
        self.sizes = self.data.partition_sizes()  # the simulator knows every client's data: it made them
        self.world = world or World(self.options.world, config.seed)
        self.coordinator = Coordinator(config, store, scheduler=scheduler, local_only=self._local_only,
                                       server=self.data.server_side())
        self.model_bytes = sum(a.nbytes for a in self.coordinator.weights.values())
        self._rng = Seeds(config.seed).numpy("simulation")
        self._deadline: EventHandle | None = None
        self._round_start = 0.0
        self._late: dict[int, dict[str, float]] = {}
        self.result = SimulationResult()

    # -- start-up ------------------------------------------------------------------------------------
    def _register_all(self) -> None:
        c, sizes = self.coordinator, self.sizes
        c.register_many({cid: {"num_samples": sizes[cid], "local_only_accuracy": None,
                               "declared_attack": self.attacks.get(cid, "none")}
                         for cid in range(self.config.data.num_clients) if cid not in c.clients})

    def _local_only(self, clients: list[int]) -> dict[int, float]:
        """Consumers' local-only baselines, trained when a reimbursement first needs them."""
        spec, train = self.config.data, self.config.train
        keys = {cid: (self.backend.name, spec, train, cid, sub_seed(self.config.seed, f"local-only:{cid}") % (2**31)) for cid in clients}
        missing = [cid for cid in clients if keys[cid] not in _BASELINES]
        tasks = [BaselineTask(cid, self.data.clients[cid], keys[cid][-1]) for cid in missing]
        for task, value in zip(tasks, self.backend.local_only(train, self.data.num_features, self.data.num_classes,
                                                              tasks), strict=True):
            _BASELINES[keys[task.client_id]] = value
        out = {cid: _BASELINES[keys[cid]] for cid in clients}
        while len(_BASELINES) > _BASELINE_CACHE:
            _BASELINES.popitem(last=False)
        return out

    def run(self, on_round: Callable[[RoundOutcome], None] | None = None,
            on_phase: Callable[[str], None] | None = None,
            on_progress: Progress | None = None) -> SimulationResult:
        """`on_progress(step, done, total)` reports the end of the job as it goes: the consumers' local-only
        baselines, then the per-client evaluation (without it, each step is a phase line)."""
        phase = on_phase or (lambda _: None)
        # the attackers are known here, and only here: the report marks them as ground truth
        self.coordinator.store.put("fl", SIMULATION_KEY, {"attacks": {str(c): a for c, a in self.attacks.items()},
                                                          "scheduler": self.config.scheduler,
                                                          "population": self.config.data.num_clients})
        phase(f"registering {self.config.data.num_clients} clients (one transaction)")
        self._register_all()
        self._on_round = on_round
        if not self.coordinator.done:
            phase("rounds")
            self.loop.schedule(0.0, self._begin_round)
        self.loop.run()
        self._finish_job(on_progress or (lambda step, done, total: phase(step) if done == 0 else None))
        self.result.virtual_time_s = self.loop.now()
        return self.result

    # -- one round -----------------------------------------------------------------------------------
    def _begin_round(self) -> None:
        c = self.coordinator
        now = self._round_start = self.loop.now()
        available = self.world.online(self.config.data.num_clients, now)
        plan = c.begin_round(available, now, self.options.deadline_s)
        cost_rng = random.Random(sub_seed(self.config.seed, f"sim/cost/{plan.round}"))
        on_time: list[tuple[TrainTask, Fate]] = []
        self._late = {}
        for cid in plan.selected:
            if self._rng.random() < self.dropout:
                continue  # the client vanishes without a word; the deadline counts it as failed
            samples = self.sizes[cid]
            fate = self.world.fate(cid, now, samples, self.config.train.epochs, self.model_bytes, cost_rng)
            measured = fate.measured() | {"num_samples": samples}
            if fate.drops and now + fate.offline_after_s <= plan.deadline:
                self.loop.schedule(fate.offline_after_s, lambda cid=cid, m=measured: self._drop(
                    plan.round, cid, "went offline before its update was sent", m))
            elif now + fate.latency_s > plan.deadline:
                self._late[cid] = measured  # it trains to the end; its update comes too late to count
            else:
                on_time.append((TrainTask(cid, self.data.clients[cid], plan.seeds[cid],
                                          self.attacks.get(cid, "none")), fate))
        job = RoundJob(plan.weights, self.config.train, c.num_features, c.num_classes)
        results = self.backend.train(job, [task for task, _ in on_time])
        for (task, fate), result in zip(on_time, results, strict=True):
            # virtual, deterministic: the measured wall/CPU times of this process would differ run to run
            metrics = result.metrics() | fate.measured() | {"received_s": fate.latency_s,
                                                            "accuracy": result.consumer_accuracy}
            self.loop.schedule(fate.latency_s, lambda cid=task.client_id, r=result, m=metrics:
                               self._arrive(plan.round, cid, r.weights, m))
        self._deadline = self.loop.schedule_at(plan.deadline, self._end_round)
        self._maybe_end()

    def _arrive(self, round_num: int, cid: int, weights, metrics: dict[str, float]) -> None:
        self.coordinator.submit(cid, round_num, weights, metrics)
        self._maybe_end()

    def _drop(self, round_num: int, cid: int, reason: str, metrics: dict[str, float]) -> None:
        plan = self.coordinator.open_round
        if plan is not None and plan.round == round_num:
            self.coordinator.drop(cid, reason, metrics)
            self._maybe_end()

    def _maybe_end(self) -> None:
        """End the round early once every selected client answered (a late or vanished one holds it open)."""
        if self._deadline is not None and not self.coordinator.waiting_for():
            self._deadline.cancel()
            self._end_round()

    def _end_round(self) -> None:
        self._deadline = None
        for cid, measured in sorted(self._late.items()):
            self.coordinator.drop(cid, LATE, measured)
        self._late = {}
        outcome = self.coordinator.finish_round(self.loop.now() - self._round_start)
        self.result.outcomes.append(outcome)
        if self._on_round:
            self._on_round(outcome)
        budget = self.options.time_budget_s
        if not self.coordinator.done and (budget is None or self.loop.now() < budget):
            self.loop.schedule(0.0, self._begin_round)

    # -- end of job ----------------------------------------------------------------------------------
    def evaluated_clients(self) -> list[int]:
        n, limit = self.config.data.num_clients, self.options.eval_clients
        if n <= limit:
            return list(range(n))
        return sorted(Seeds(self.config.seed).random("sim/eval-clients").sample(range(n), limit))

    def client_accuracies(self, clients: list[int], weights: Weights) -> dict[int, float]:
        """A model's accuracy on each client's own test split (what those consumers would measure); the built-in
        MLP scores a chunk of clients in one pass over their concatenated test splits."""
        if self.config.train.model:
            return {cid: evaluate(weights, self.data.clients[cid].x_test, self.data.clients[cid].y_test,
                                  self.config.train.model, self.coordinator.num_classes)["accuracy"] for cid in clients}
        parts = [self.data.clients[cid] for cid in clients]
        x = np.concatenate([p.x_test for p in parts])
        y = np.concatenate([p.y_test for p in parts])
        correct = (logits(weights, x).argmax(axis=1) == y).astype(np.float64)
        counts = np.array([len(p.y_test) for p in parts])
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
        hits = np.add.reduceat(correct, starts) if len(correct) else np.zeros(len(parts))
        return {cid: float(h / n) if n else 0.0 for cid, h, n in zip(clients, hits, counts, strict=True)}

    def _finish_job(self, progress: Progress) -> None:
        """Score the kept model on the evaluated clients, train the local-only baselines the final refunds need
        (each once; the coordinator then finds them made), and close the job: all in chunks, with progress."""
        c = self.coordinator
        clients, accuracies = self.evaluated_clients(), {}
        progress(EVALUATING, 0, len(clients))
        for start in range(0, len(clients), EVAL_CHUNK):
            accuracies |= self.client_accuracies(clients[start:start + EVAL_CHUNK], c.kept_weights)
            progress(EVALUATING, len(accuracies), len(clients))
        if not c.finished:
            needed = sorted(cid for cid in set(c.consumer_accuracy) | set(accuracies)
                            if cid in c.clients and c.clients[cid]["local_only_accuracy"] is None)
            progress(BASELINES, 0, len(needed))
            for start in range(0, len(needed), BASELINE_CHUNK):
                self._local_only(needed[start:start + BASELINE_CHUNK])
                progress(BASELINES, min(start + BASELINE_CHUNK, len(needed)), len(needed))
        c.finish_job(accuracies)
        c.store.put("fl", CLIENT_ACCURACY_KEY, {str(k): v for k, v in accuracies.items()})
        self.result.client_accuracy = accuracies
