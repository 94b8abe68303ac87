"""`fl-client run`: join a server, train when selected, report update, quality and measured resources.

The client asks the server for the job (dataset, partition, seed), rebuilds its own partition,
trains its local-only baseline once (the consumer's reference for the utility ratio) and then
follows the server's task stream. If the server goes away (restart) it reconnects for up to
`reconnect_s`; a refused token or a bad request ends it with a clear error.
"""
from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass

import numpy as np

from mlsyskit.core.clock import Clock, RealClock
from mlsyskit.core.rpc import ClientTls, RpcClient, RpcError, StatusCode
from mlsyskit.core.sim import Seeds
from mlsyskit.tools.fl.config import DataSpec, TrainSpec
from mlsyskit.tools.fl.data import load_client
from mlsyskit.tools.fl.model import evaluate
from mlsyskit.tools.fl.threads import freeze_startup_heap, single_threaded
from mlsyskit.tools.fl.training import local_only_accuracy, train_local

log = logging.getLogger("mlsyskit.fl.client")


class ClientStopped(Exception):
    """The client cannot continue (refused, misconfigured); the message says why."""


@dataclass
class ClientSummary:
    rounds_trained: int = 0
    rejected: int = 0
    evaluated: bool = False
    done: bool = False


class FlClient:
    def __init__(self, address: str, client_id: int, *, dataset: str | None = None, attack: str = "none",
                 token: str | None = None, tls: ClientTls | None = None, reconnect_s: float = 30.0,
                 clock: Clock | None = None, exit_after_round: int | None = None, freeze_heap: bool = False) -> None:
        self.address = address
        self.client_id = client_id
        self.dataset = dataset
        self.attack = attack
        self.reconnect_s = reconnect_s
        self.clock = clock or RealClock()
        self.exit_after_round = exit_after_round  # fault injection for tests: vanish mid-round
        self.freeze_heap = freeze_heap  # freeze_startup_heap() once ready (the CLI paused GC at start-up)
        self.rpc = RpcClient(address, token=token, tls=tls, timeout=60.0)
        self.summary = ClientSummary()
        self._data = None
        self._local_only: float | None = None

    async def _prepare(self) -> None:
        job = await self.rpc.call("job", {})
        spec = DataSpec(**job["data"])
        if self.dataset is not None and self.dataset != spec.dataset:
            raise ClientStopped(f"the server runs dataset {spec.dataset!r}, not {self.dataset!r}")
        try:
            self._data, self.num_features, self.num_classes = load_client(spec, self.client_id)
        except ValueError as e:
            raise ClientStopped(str(e)) from None
        self.train_spec = TrainSpec(**job["train"])
        if self._local_only is None:
            seed = Seeds(spec.seed).seed(f"local-only:{self.client_id}") % (2**31)
            self._local_only = await asyncio.to_thread(local_only_accuracy, self._data, self.train_spec,
                                                       self.num_features, self.num_classes, seed)
            if self.freeze_heap:
                freeze_startup_heap()

    async def run(self) -> ClientSummary:
        single_threaded()
        try:
            while not self.summary.done:
                try:
                    await self.rpc.connect(self.reconnect_s)
                except RpcError as e:
                    raise ClientStopped(e.message) from None
                try:
                    await self._prepare()
                    await self._follow()
                except RpcError as e:
                    if e.code not in (StatusCode.UNAVAILABLE, StatusCode.CANCELLED):
                        raise ClientStopped(e.message) from None
                    log.warning("client %d lost the server (%s); reconnecting", self.client_id, e.message)
                await self.rpc.close()  # a fresh channel for the next attempt
        finally:
            await self.rpc.close()
        return self.summary

    async def _follow(self) -> None:
        hello = {"client_id": self.client_id, "num_samples": self._data.num_samples,
                 "local_only_accuracy": self._local_only, "declared_attack": self.attack}
        session = self.rpc.bidi("session", timeout=None)  # tasks in, updates out, one call for the job
        try:
            await session.send(hello)
            async for task in session:
                kind = task.get("type")
                if kind == "train":
                    await session.send(self._train(task))
                elif kind == "receipt":
                    self._receipt(task)
                elif kind == "evaluate":
                    await self._evaluate(task)
                elif kind == "done":
                    self.summary.done = True
                    return
        finally:
            session.cancel()

    def _train(self, task: dict) -> dict:
        spec = TrainSpec(**task["train"])
        # inline, not in a worker thread: the client has nothing else to do meanwhile, and the hop to a
        # thread and back cost ~0.15 ms of CPU per round (gRPC keepalive pings are answered by its core)
        result = train_local(task["weights"], self._data, spec, self.num_features, self.num_classes,
                             int(task["seed"]), self.attack)
        if self.exit_after_round is not None and task["round"] >= self.exit_after_round:
            log.error("client %d: crashing in round %d (fault injection)", self.client_id, task["round"])
            os._exit(3)  # like a kill: no goodbye, the server sees the connection drop
        self.summary.rounds_trained += 1
        return {"client_id": self.client_id, "round": task["round"], "weights": result.weights,
                "metrics": result.metrics()}

    def _receipt(self, receipt: dict) -> None:
        if not receipt.get("accepted"):
            self.summary.rejected += 1
            log.warning("round %s: update rejected: %s", receipt.get("round"), receipt.get("reason"))

    async def _evaluate(self, task: dict) -> None:
        acc = evaluate({k: np.asarray(v) for k, v in task["weights"].items()}, self._data.x_test,
                       self._data.y_test)["accuracy"]
        await self.rpc.call("evaluate", {"client_id": self.client_id, "accuracy": acc})
        self.summary.evaluated = True
