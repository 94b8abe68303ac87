"""The round state machine shared by `fl-server run` and `fl-server simulate`.

It never touches the network or the clock: the driver tells it that a client registered, that
a round should begin (with who is available and the current time), that an update arrived,
that a client dropped, and that the round is over (all replied, or the deadline passed). Each
finished round is committed in one MetaStore transaction: ledger transfers, the round record
and the checkpoint (model, selector memory, counters), so a restart resumes from the last
committed round with the books balanced.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mlsyskit.core.clock import Clock
from mlsyskit.core.rpc_codec import decode, encode
from mlsyskit.core.sim import Seeds, sub_seed
from mlsyskit.core.storage import MetaStore
from mlsyskit.tools.fl.aggregation import validate_update
from mlsyskit.tools.fl.config import JobConfig
from mlsyskit.tools.fl.data import load_federated
from mlsyskit.tools.fl.incentive.ledger import MINT, POOL, Ledger, Transfer, client_account
from mlsyskit.tools.fl.model import Weights, evaluate, init_weights, shape_mismatch
from mlsyskit.tools.fl.outcome import ClientReport, RoundOutcome
from mlsyskit.tools.fl.selection.base import Selector
from mlsyskit.tools.fl.selectors import scheduled_selector
from mlsyskit.tools.fl.strategy import STRATEGIES
from mlsyskit.tools.fl.strategy.base import Validation
from mlsyskit.tools.fl.task import ClientData, ServerData

NS = "fl"


class JobMismatch(ValueError):
    """The run directory holds a different job than the one asked for."""


@dataclass(frozen=True)
class RoundPlan:
    round: int
    selected: list[int]
    weights: Weights
    train: dict[str, Any]  # the TrainSpec as a dict
    seeds: dict[int, int]  # per-client training seed
    deadline: float  # absolute, on the coordinator's clock
    deadline_s: float  # its length, kept as chosen: deadline - opened differs in the last bits


class Coordinator:
    def __init__(self, config: JobConfig, store: MetaStore, clock: Clock | None = None,
                 scheduler: Selector | None = None,
                 local_only: Callable[[list[int]], dict[int, float]] | None = None,
                 server: ServerData | None = None) -> None:
        """`scheduler`: a configured instance of `config.scheduler` (free weights), else one is made by name.
        `local_only` computes consumers' local-only baselines that registered without one (None), when first
        needed (a simulation's lazy clients). `server`: what the server holds (task, validation and test sets);
        None is an experiment (simulation, tests): the server side of config.data partitioned in this process."""
        self.config = config
        self.clock = clock  # only times the phases of finish_round (None: not timed)
        self.store = store
        self.ledger = Ledger(store)
        # an experiment knows every partition, so a claimed sample count is checked (FedAvg and TIFF's pay weigh
        # by it); in a real federation (`server` given) a client's count is its word and nothing else is checked
        self.partition_sizes: tuple[int, ...] | None = None
        if server is None:
            data = load_federated(config.data)
            server, self.partition_sizes = data.server_side(), data.partition_sizes()
        self.server = server
        self.num_features, self.num_classes = server.num_features, server.num_classes
        model, classes = config.train.model, server.num_classes

        def val_accuracy(weights: Weights) -> float:
            return evaluate(weights, server.x_val, server.y_val, model, classes)["accuracy"]

        def evaluator(weights: Weights) -> dict[str, float]:  # test metrics, and the server's validation accuracy
            return evaluate(weights, server.x_test, server.y_test, model, classes) | \
                {"val_accuracy": val_accuracy(weights)}

        validation = Validation(ClientData(-1, server.x_val, server.y_val, server.x_val[:0], server.y_val[:0]),
                                server.num_features, server.num_classes, val_accuracy)
        self.strategy = STRATEGIES.get(config.strategy)(config, server.evaluator or evaluator, validation)
        self._local_only = local_only
        if scheduler is not None and scheduler.name != config.scheduler:
            raise ValueError(f"the scheduler given ({scheduler.name}) is not the job's ({config.scheduler or 'none'})")
        if config.scheduler:  # before _resume, which restores the selector's memory
            self.strategy.selector = scheduled_selector(config.scheduler, self.strategy.selector, scheduler)
        self.weights = init_weights(self.num_features, self.num_classes, config.train.hidden,
                                    sub_seed(config.seed, "model-init"), config.train.model)
        self.round = 0  # last committed round
        self.clients: dict[int, dict[str, Any]] = {}
        self.consumer_accuracy: dict[int, float] = {}
        self.last_reimbursed = 0
        self.finished = False
        # the model the job keeps: the best so far on the server's validation split (the last one can be worse)
        self.kept_weights, self.kept_round, self.kept_val_accuracy = self.weights, 0, -1.0
        self.kept_accuracy: float | None = None  # its test accuracy
        self._consumers: list[int] = []  # connected when the open round began: the ones charged for it
        self._plan: RoundPlan | None = None
        self._reports: dict[int, ClientReport] = {}
        self._updates: dict[int, Weights] = {}
        self._resume()

    # -- persistence -------------------------------------------------------------------------------
    def _resume(self) -> None:
        stored = self.store.get(NS, "config", None)
        if stored is None:
            self.store.put(NS, "config", self.config.to_dict())
            return
        mine = self.config.to_dict()
        for key in ("strategy", "seed", "data", "train", "selection", "economy"):
            if stored.get(key) != mine.get(key):
                raise JobMismatch(f"{self.store.path} holds a job with a different {key}; use a fresh run directory")
        if stored.get("scheduler", "") != self.config.scheduler:  # its memory would not fit another scheduler
            raise JobMismatch(f"{self.store.path} holds a job with scheduler {stored.get('scheduler') or '(none)'!r}; "
                              "use the same --scheduler or a fresh run directory")
        self.store.put(NS, "config", mine)  # rounds/per_round/timeouts may change on resume
        for key, info in self.store.items("fl_clients"):
            self.clients[int(key)] = info
        self._tell_selector(self.clients)
        state = self.store.get(NS, "state", None)
        if state is not None:
            self.round = state["round"]
            self.weights = decode(state["weights"])
            self.strategy.selector.load_state_dict(state["selector"])
            self.strategy.load_state_dict(state.get("strategy", {}))
            self.consumer_accuracy = {int(k): v for k, v in state["consumer_accuracy"].items()}
            self.last_reimbursed = state["last_reimbursed"]
            kept = state.get("kept")
            if kept is not None:
                self.kept_weights, self.kept_round = decode(kept["weights"]), kept["round"]
                self.kept_val_accuracy, self.kept_accuracy = kept["val_accuracy"], kept["accuracy"]
            else:
                self.kept_weights, self.kept_round = self.weights, self.round
            self.finished = state["finished"] and self.round >= self.config.rounds  # more rounds asked: reopen

    def _checkpoint(self) -> None:
        self.store.put(NS, "state", {
            "round": self.round, "weights": encode(self.weights),
            "selector": self.strategy.selector.state_dict(), "strategy": self.strategy.state_dict(),
            "consumer_accuracy": {str(k): v for k, v in self.consumer_accuracy.items()},
            "last_reimbursed": self.last_reimbursed, "finished": self.finished,
            "kept": {"weights": encode(self.kept_weights), "round": self.kept_round,
                     "val_accuracy": self.kept_val_accuracy, "accuracy": self.kept_accuracy}})

    # -- registration ------------------------------------------------------------------------------
    def register(self, client_id: int, info: dict[str, Any]) -> None:
        """A client joined (or rejoined). First-time clients receive the endowment."""
        self.register_many({client_id: info})

    def register_many(self, infos: dict[int, dict[str, Any]]) -> None:
        """Clients joined, all in one transaction (a simulation registers its whole population at once)."""
        records, transfers = {}, []
        for client_id, info in sorted(infos.items()):
            records[client_id] = self._record(client_id, info)
            if client_id not in self.clients:
                transfers.append(Transfer(MINT, client_account(client_id), self.config.economy.endowment,
                                          "endowment"))
        with self.store.transaction():
            self.ledger.apply(self.round, transfers)
            for client_id, record in records.items():
                self.clients[client_id] = record
                self.store.put("fl_clients", str(client_id), record)
        self._tell_selector(records)

    def _tell_selector(self, records: dict[int, dict[str, Any]]) -> None:
        """The selector learns the registered sample counts (Oort explores big clients first, as FedScale's)."""
        self.strategy.selector.register_clients({cid: r["num_samples"] for cid, r in records.items()})

    def _record(self, client_id: int, info: dict[str, Any]) -> dict[str, Any]:
        if not 0 <= client_id < self.config.data.num_clients:
            raise ValueError(f"client id {client_id} is outside 0..{self.config.data.num_clients - 1}")
        if "shapes" in info:  # the client built its model from the same TrainSpec: names and shapes must agree
            mismatch = shape_mismatch(self.weights, info["shapes"])
            if mismatch is not None:
                raise ValueError(f"client {client_id}: {mismatch}")
        local = info.get("local_only_accuracy", 0.0)  # None: computed when first needed (local_only)
        return {"num_samples": int(info.get("num_samples", 0)),
                "local_only_accuracy": None if local is None else float(local),
                "declared_attack": str(info.get("declared_attack", "none"))}

    # -- one round ---------------------------------------------------------------------------------
    @property
    def done(self) -> bool:
        return self.round >= self.config.rounds

    @property
    def open_round(self) -> RoundPlan | None:
        return self._plan

    def begin_round(self, available: list[int], now: float, deadline_s: float | None = None) -> RoundPlan:
        """Select and open the next round. Its deadline: `deadline_s` if given, else the scheduler's
        `round_deadline` for the selected clients, capped by round_timeout_s (the hard limit)."""
        if self._plan is not None:
            raise RuntimeError(f"round {self._plan.round} is still open")
        number = self.round + 1
        rng = Seeds(self.config.seed).random(f"select:{number}")
        self._consumers = sorted(set(available) & set(self.clients))
        selected = self.strategy.configure_round(number, self._consumers, rng)
        started = self.clock.now() if self.clock is not None else None
        self.strategy.prepare_round(number, self.weights, sub_seed(self.config.seed, f"reference:{number}") % (2**31))
        if started is not None:  # TIFF's reference update took server time: the providers' deadline starts after it
            now += self.clock.now() - started
        seeds = {cid: sub_seed(self.config.seed, f"train:{number}:{cid}") % (2**31) for cid in selected}
        if deadline_s is None:
            proposed = getattr(self.strategy.selector, "round_deadline", None)
            deadline_s = self.config.round_timeout_s
            if proposed is not None and selected:
                deadline_s = min(deadline_s, proposed(selected) or deadline_s)
        self._plan = RoundPlan(number, selected, self.weights, self.config.train.__dict__.copy(), seeds,
                               now + deadline_s, deadline_s)
        self._reports, self._updates = {}, {}
        return self._plan

    def submit(self, client_id: int, round_num: int, weights: Any, metrics: Any) -> tuple[bool, str]:
        """Check an update; (accepted, reason). A rejected update is recorded and will not be paid."""
        plan = self._plan
        if plan is None or round_num != plan.round:
            return False, f"round {round_num} is not open"
        if client_id not in plan.selected:
            return False, f"client {client_id} was not selected in round {round_num}"
        if client_id in self._reports:
            return False, f"client {client_id} already reported in round {round_num}"
        reason = validate_update(weights, metrics, self.weights, self.config.max_update_bytes)
        if reason is None and self.partition_sizes is not None \
                and int(metrics["num_samples"]) != self.partition_sizes[client_id]:
            reason = (f"num_samples {metrics['num_samples']} differs from client {client_id}'s partition size "
                      f"{self.partition_sizes[client_id]}")
        clean = {k: float(v) for k, v in metrics.items() if isinstance(v, int | float)} \
            if isinstance(metrics, dict) else {}
        if reason is None and "consumer_accuracy" in clean and not 0 <= clean["consumer_accuracy"] <= 1:
            # it feeds the consumers' refunds (utility ratio): out of [0, 1] (or NaN) is a lie, not a measurement
            reason = f"consumer_accuracy {clean['consumer_accuracy']} is outside [0, 1]"
        verdict = self.strategy.verify(weights, int(metrics["num_samples"])) if reason is None else None
        if verdict is not None and verdict.reason is not None:
            reason = verdict.reason  # checked before the receipt, so an accepted receipt stays true
        if reason is not None:
            self._reports[client_id] = ClientReport(client_id, clean, "rejected", reason)
            return False, reason
        self._reports[client_id] = ClientReport(client_id, clean,
                                                verified_quality=None if verdict is None else verdict.quality)
        self._updates[client_id] = weights
        if "consumer_accuracy" in clean:
            self.consumer_accuracy[client_id] = clean["consumer_accuracy"]
        return True, ""

    def drop(self, client_id: int, reason: str, metrics: dict[str, float] | None = None) -> None:
        """A selected client went away before reporting (connection lost), or its update came too late
        (`deadline` in the reason); `metrics` keeps what it measured, e.g. the compute it wasted."""
        plan = self._plan
        if plan is not None and client_id in plan.selected and client_id not in self._reports:
            self._reports[client_id] = ClientReport(client_id, dict(metrics or {}), "failed", reason)

    def waiting_for(self) -> list[int]:
        plan = self._plan
        return [] if plan is None else [c for c in plan.selected if c not in self._reports]

    def finish_round(self, duration_s: float) -> RoundOutcome:
        plan = self._plan
        if plan is None:
            raise RuntimeError("no round is open")
        for cid in self.waiting_for():
            self._reports[cid] = ClientReport(cid, {}, "failed", "no update before the deadline")
        outcome = RoundOutcome(plan.round, plan.selected, dict(sorted(self._reports.items())), duration_s=duration_s)
        now = self.clock.now if self.clock is not None else None
        t0 = now() if now else 0.0
        new_weights = self.strategy.aggregate(self.weights, self._updates, outcome)
        t1 = now() if now else 0.0
        outcome.global_metrics = self.strategy.evaluate(new_weights)
        if outcome.global_metrics["val_accuracy"] > self.kept_val_accuracy:
            self.kept_weights, self.kept_round = new_weights, plan.round
            self.kept_val_accuracy = outcome.global_metrics["val_accuracy"]
            self.kept_accuracy = outcome.global_metrics["accuracy"]
        outcome.global_metrics |= {"kept_round": self.kept_round, "kept_accuracy": self.kept_accuracy,
                                   "deadline_s": plan.deadline_s}
        t2 = now() if now else 0.0
        incentive = self.strategy.incentive
        with self.store.transaction():
            transfers, pot = incentive.collect(self._consumers, self.ledger.balances())  # absent consumers pay nothing
            transfers += incentive.pay_providers(outcome, pot)
            self.ledger.apply(plan.round, transfers)
            self.strategy.selector.observe(outcome)
            self.weights, self.round, self._plan = new_weights, plan.round, None
            every = self.config.economy.reimburse_every
            if every and self.round % every == 0:
                self._reimburse(self.consumer_accuracy)
            self.store.append("fl_rounds", outcome.to_record())
            self._checkpoint()
        if now:
            outcome.phases.update(aggregate_s=t1 - t0, evaluate_s=t2 - t1, commit_s=now() - t2)
        return outcome

    # -- end of job --------------------------------------------------------------------------------
    def _reimburse(self, accuracies: dict[int, float]) -> None:
        paid = {client_id_of(a): v for a, v in
                self.ledger.totals_by("price", "payer", since_round=self.last_reimbursed).items()}
        self._fill_local_only(sorted(c for c in accuracies if c in self.clients))
        uir = {}
        for cid, info in self.clients.items():
            local = info["local_only_accuracy"]
            if cid in accuracies and local is not None:
                uir[cid] = (accuracies[cid] - local) / max(local, 1e-6)
        transfers = self.strategy.incentive.reimburse(self.ledger.balance(POOL), paid, uir)
        self.ledger.apply(self.round, transfers)
        refunds = {int(t.payee.split(":")[1]): t.amount for t in transfers}
        self.store.append("fl_reimbursements", {
            "round": self.round, "consumers": {str(cid): {
                "paid": paid.get(cid, 0.0), "refund": refunds.get(cid, 0.0),
                "trr": refunds.get(cid, 0.0) / paid[cid] if paid.get(cid) else 0.0,
                "uir": uir.get(cid), "global_accuracy": accuracies.get(cid),
                "local_only_accuracy": self.clients[cid]["local_only_accuracy"]} for cid in sorted(self.clients)}})
        self.last_reimbursed = self.round

    def _fill_local_only(self, consumers: list[int]) -> None:
        """Compute the baselines not known yet (inside the caller's transaction)."""
        missing = [c for c in consumers if self.clients[c]["local_only_accuracy"] is None]
        if not missing or self._local_only is None:
            return
        for cid, local in self._local_only(missing).items():
            self.clients[cid] = self.clients[cid] | {"local_only_accuracy": float(local)}
            self.store.put("fl_clients", str(cid), self.clients[cid])

    def finish_job(self, accuracies: dict[int, float]) -> None:
        """Final reimbursement with each consumer's accuracy of the final model on its own data."""
        if self.finished:
            return
        self.consumer_accuracy.update(accuracies)
        with self.store.transaction():
            if self.last_reimbursed < self.round:
                self._reimburse(self.consumer_accuracy)
            self.finished = True
            self._checkpoint()


def client_id_of(account: str) -> int:
    return int(account.split(":", 1)[1])
