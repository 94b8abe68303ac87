"""`fl-server run`: the Coordinator behind core.rpc.

RPC methods (msgpack payloads, weights as raw arrays):
  job      unary   -> the DataSpec and TrainSpec, so a client can load its partition
  session  bidi    what fl-client uses: its first message registers (as `join`), later ones are its
                   updates (as `submit`); the server sends the `join` tasks plus a
                   {"type": "receipt", round, accepted, reason} per update. One call for the whole job,
                   so a round costs two messages per client instead of a message and a unary call.
  join     stream  register (num_samples, local-only accuracy) and receive tasks:
                   {"type": "train", round, weights, train, seed} | {"type": "evaluate", weights} | {"type": "done"}
  submit   unary   a round's update + metrics -> {"accepted", "reason"}
  evaluate unary   the consumer's accuracy of the final model on its own test split
  status   unary   round, registered and connected clients
A client whose `join` stream drops is counted as failed in the open round (and can rejoin).
Rounds end when every selected client has reported or dropped, or at the deadline.
"""
from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

from mlsyskit.core.clock import Clock, RealClock
from mlsyskit.core.rpc import (
    DEFAULT_MAX_MESSAGE_BYTES,
    CallContext,
    RpcError,
    RpcServer,
    ServerTls,
    StatusCode,
)
from mlsyskit.core.storage import MetaStore
from mlsyskit.core.telemetry import Telemetry
from mlsyskit.tools.fl.config import JobConfig
from mlsyskit.tools.fl.coordinator import Coordinator
from mlsyskit.tools.fl.outcome import RoundOutcome

log = logging.getLogger("mlsyskit.fl.server")

ENVELOPE_BYTES = 1 << 20  # room for the msgpack envelope and metrics around an update's arrays


def transport_limit(config: JobConfig) -> int:
    """gRPC's per-message cap for this job: twice the job's update limit plus an envelope (never below
    core.rpc's default). An update over the job's limit must reach validate_update, to be rejected
    with a logged reason and unpaid; if gRPC refused it first, the client would just see a lost connection."""
    return max(DEFAULT_MAX_MESSAGE_BYTES, 2 * config.max_update_bytes + ENVELOPE_BYTES)


def _field(payload: Any, name: str, kind: type | tuple[type, ...]) -> Any:
    if not isinstance(payload, dict) or not isinstance(payload.get(name), kind) or isinstance(payload.get(name), bool):
        raise RpcError(StatusCode.INVALID_ARGUMENT, f"field {name!r} is missing or not a {kind}")
    return payload[name]


class FlServer:
    def __init__(self, config: JobConfig, store: MetaStore, *, address: str = "127.0.0.1:0",
                 token: str | None = None, tls: ServerTls | None = None, clock: Clock | None = None,
                 telemetry: Telemetry | None = None, on_round=None, eval_timeout_s: float = 10.0,
                 max_message_bytes: int | None = None, crash_after_round: int | None = None) -> None:
        self.config = config
        self.clock = clock or RealClock()
        self.coordinator = Coordinator(config, store, self.clock)
        self.telemetry = telemetry or Telemetry(self.clock)
        self.on_round = on_round
        self.eval_timeout_s = eval_timeout_s
        self.crash_after_round = crash_after_round
        self.max_message_bytes = max_message_bytes or transport_limit(config)  # None: derived from the job
        self.rpc = RpcServer(address, token=token, tls=tls, max_message_bytes=self.max_message_bytes)
        for name in ("job", "submit", "evaluate", "status"):
            self.rpc.unary(name, getattr(self, f"_{name}"))
        self.rpc.stream("join", self._join)
        self.rpc.bidi("session", self._session)
        self._queues: dict[int, asyncio.Queue] = {}
        self._generation: dict[int, int] = {}
        self._changed = asyncio.Event()  # something happened that may end a wait
        self._eval_results: dict[int, float] = {}
        self.outcomes: list[RoundOutcome] = []

    # -- handlers ----------------------------------------------------------------------------------
    async def _job(self, payload: Any, call: CallContext) -> dict:
        return {"data": self.config.to_dict()["data"], "train": self.config.to_dict()["train"],
                "strategy": self.config.strategy, "rounds": self.config.rounds}

    async def _status(self, payload: Any, call: CallContext) -> dict:
        plan = self.coordinator.open_round
        return {"round": self.coordinator.round, "open_round": plan.round if plan else None,
                "registered": sorted(self.coordinator.clients), "connected": sorted(self._queues),
                "done": self.coordinator.finished}

    async def _session(self, requests, call: CallContext):
        try:
            hello = await anext(requests)
        except StopAsyncIteration:
            return
        cid = _field(hello, "client_id", int)
        reader = asyncio.create_task(self._receive_updates(cid, requests))
        try:
            async for message in self._join(hello, call):
                yield message
        finally:
            reader.cancel()

    async def _receive_updates(self, cid: int, requests) -> None:
        """A session's later messages are its updates; each gets a receipt on the task stream."""
        try:
            async for update in requests:
                if _field(update, "client_id", int) != cid:
                    raise RpcError(StatusCode.INVALID_ARGUMENT, f"this session belongs to client {cid}")
                reply = self._take_update(update)
                queue = self._queues.get(cid)
                if queue is not None:
                    queue.put_nowait({"type": "receipt", "round": update["round"], **reply})
        except RpcError as e:  # garbage or a bad message ends this client's session, not the job
            queue = self._queues.get(cid)
            if queue is not None:
                queue.put_nowait(e)

    async def _join(self, payload: Any, call: CallContext):
        cid = _field(payload, "client_id", int)
        info = {"num_samples": _field(payload, "num_samples", int),
                "local_only_accuracy": float(_field(payload, "local_only_accuracy", (int, float))),
                "declared_attack": str(payload.get("declared_attack", "none"))}
        try:
            self.coordinator.register(cid, info)
        except ValueError as e:
            raise RpcError(StatusCode.INVALID_ARGUMENT, str(e)) from None
        generation = self._generation.get(cid, 0) + 1
        self._generation[cid] = generation
        old = self._queues.get(cid)
        if old is not None:
            old.put_nowait(None)  # a rejoin supersedes the old stream
        queue: asyncio.Queue = asyncio.Queue()
        self._queues[cid] = queue
        self.telemetry.event("join", client=cid, peer=call.peer)
        log.info("client %d joined from %s", cid, call.peer)
        self._poke()
        try:
            yield {"type": "welcome", "round": self.coordinator.round}
            if self.coordinator.finished:
                yield {"type": "done"}
                return
            while True:
                message = await queue.get()
                if message is None:
                    return
                if isinstance(message, RpcError):
                    raise message
                yield message
                if message["type"] == "done":
                    return
        finally:
            if self._generation.get(cid) == generation:
                self._queues.pop(cid, None)
                self.coordinator.drop(cid, "connection lost")
                self.telemetry.event("leave", client=cid)
                log.info("client %d left", cid)
                self._poke()

    async def _submit(self, payload: Any, call: CallContext) -> dict:
        return self._take_update(payload)

    def _take_update(self, payload: Any) -> dict:
        cid = _field(payload, "client_id", int)
        round_num = _field(payload, "round", int)
        accepted, reason = self.coordinator.submit(cid, round_num, payload.get("weights"), payload.get("metrics"))
        if not accepted:
            log.warning("rejected update from client %d in round %d: %s", cid, round_num, reason)
            self.telemetry.event("rejected", client=cid, round=round_num, reason=reason)
        self._poke()
        return {"accepted": accepted, "reason": reason}

    async def _evaluate(self, payload: Any, call: CallContext) -> dict:
        cid = _field(payload, "client_id", int)
        acc = float(_field(payload, "accuracy", (int, float)))
        if not 0 <= acc <= 1:
            raise RpcError(StatusCode.INVALID_ARGUMENT, f"accuracy {acc} is outside [0, 1]")
        self._eval_results[cid] = acc
        self._poke()
        return {"ok": True}

    # -- driving rounds ----------------------------------------------------------------------------
    def _poke(self) -> None:
        self._changed.set()

    async def _wait(self, condition, deadline: float | None) -> bool:
        """Wait until condition() holds (True) or the clock passes deadline (False)."""
        while not condition():
            self._changed.clear()
            remaining = None if deadline is None else deadline - self.clock.now()
            if remaining is not None and remaining <= 0:
                return False
            try:
                await asyncio.wait_for(self._changed.wait(), remaining)
            except TimeoutError:
                return condition()
        return True

    async def start(self) -> int:
        return await self.rpc.start()

    async def serve(self, registration_timeout_s: float | None = None) -> None:
        """Run the remaining rounds, the final evaluation and reimbursement, then tell clients we are done."""
        c = self.coordinator
        want = self.config.wait_for
        while not c.done:
            # like Flower's min_available_clients: every round waits for enough connected clients
            deadline = None if registration_timeout_s is None else self.clock.now() + registration_timeout_s
            if not await self._wait(lambda: len(self._queues) >= want, deadline):
                raise RpcError(StatusCode.DEADLINE_EXCEEDED, f"only {len(self._queues)} of {want} clients "
                               f"connected within {registration_timeout_s:g}s before round {c.round + 1} "
                               f"(--min-clients sets how many a round waits for; rerun to resume)")
            start = self.clock.now()
            plan = c.begin_round(sorted(self._queues), start)
            self.telemetry.event("round_start", round=plan.round, selected=plan.selected)
            for cid in plan.selected:
                self._queues[cid].put_nowait({"type": "train", "round": plan.round, "weights": plan.weights,
                                              "train": plan.train, "seed": plan.seeds[cid]})
            await self._wait(lambda: not c.waiting_for(), plan.deadline)
            collected = self.clock.now()
            outcome = c.finish_round(collected - start)
            outcome.phases = {"collect_s": collected - start, **outcome.phases}
            self.outcomes.append(outcome)
            self.telemetry.event("round_end", **outcome.to_record())
            self.telemetry.observe("round_s", outcome.duration_s)
            if self.on_round:
                self.on_round(outcome)
            if self.crash_after_round is not None and outcome.round >= self.crash_after_round:
                log.error("crashing after round %d (fault injection)", outcome.round)
                os._exit(3)  # like a kill: the round is committed, nothing else is
        if not c.finished:
            await self._final_evaluation()
        for queue in list(self._queues.values()):
            queue.put_nowait({"type": "done"})
        await self._wait(lambda: not self._queues, self.clock.now() + 5.0)  # let the streams deliver it

    async def _final_evaluation(self) -> None:
        c = self.coordinator
        self._eval_results = {}
        asked = sorted(self._queues)
        for cid in asked:
            self._queues[cid].put_nowait({"type": "evaluate", "weights": c.weights})
        await self._wait(lambda: all(cid in self._eval_results or cid not in self._queues for cid in asked),
                         self.clock.now() + self.eval_timeout_s)
        c.finish_job(dict(self._eval_results))
        self.telemetry.event("job_end", consumer_accuracy=self._eval_results)

    async def stop(self, grace: float = 1.0) -> None:
        for queue in list(self._queues.values()):
            queue.put_nowait(None)
        await self.rpc.stop(grace)
