"""`fl-server run`: the Coordinator behind core.rpc.

The RPC methods and their messages: server_wire.py.

Identity: with mutual TLS (a client CA) every call that names a client id must come from the
certificate with that id as its common name; the token alone does not make anyone a client. One
client id has one session: a second while the first is alive (busy with a task, or heard from within
its heartbeat window) is refused with ALREADY_EXISTS and the first keeps its session; only a session
gone silent is superseded (its host died without closing the connection).
A round begins once `min_clients` are connected (waiting up to `fill_timeout_s` more for
`per_round` of them) and selects only among the connected; it ends when every selected client has
reported or dropped, or at its deadline. A client that reconnects mid-round is dropped from that
round at once (its old stream is gone). A server killed mid-round re-opens that round on restart.

Resources, measured: the server times each update's round trip itself (`received_s`, task sent to
update in) and records `comm_time_s` = received_s - the client's own `local_s` (task in to update
out), so neither depends on clock agreement and a client cannot make itself look faster than the
server saw it. A round selects among the *available* clients: connected, not still busy with an
earlier task, and, for clients that send heartbeats, heard from within `heartbeat_misses` x
`heartbeat_s` (a stopped or frozen host drops out of selection). With a scheduler (`--scheduler`),
its `round_deadline` shortens the round's deadline; an update that arrives after its round closed
is wasted work, counted (`wasted` in each round_end event) and answered "late". Each round_end
event carries the deadline, the available clients, and the scheduler's tier and latency EMA per
client.
"""
from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

from mlsyskit.core.clock import Clock, RealClock
from mlsyskit.core.errors import RuntimeFailure
from mlsyskit.core.rpc import CallContext, RpcError, RpcServer, ServerTls, StatusCode
from mlsyskit.core.rpc_codec import encoded_arrays
from mlsyskit.core.storage import MetaStore
from mlsyskit.core.telemetry import Telemetry
from mlsyskit.tools.fl.activity import ClientActivity
from mlsyskit.tools.fl.config import JobConfig
from mlsyskit.tools.fl.coordinator import Coordinator
from mlsyskit.tools.fl.incentive.ledger import client_account
from mlsyskit.tools.fl.outcome import RoundOutcome
from mlsyskit.tools.fl.sched_report import observe_late, scheduling_record
from mlsyskit.tools.fl.server_wire import (
    Books,
    Earnings,
    HeldBack,
    Receipts,
    SessionQueue,
    field,
    next_messages,
    round_end_message,
    transport_limit,
)
from mlsyskit.tools.fl.task import ServerData
from mlsyskit.tools.fl.tls_door import TlsDoor

log = logging.getLogger("mlsyskit.fl.server")


class FlServer:
    def __init__(self, config: JobConfig, store: MetaStore, *, server: ServerData | None = None,
                 address: str = "127.0.0.1:0", token: str | None = None, tls: ServerTls | None = None,
                 clock: Clock | None = None, telemetry: Telemetry | None = None, on_round=None,
                 eval_timeout_s: float = 10.0, max_message_bytes: int | None = None, crash_after_round: int | None = None,
                 require_identity: bool | None = None, linger_s: float = 10.0, heartbeat_s: float = 2.0,
                 heartbeat_misses: int = 3, tls_door: bool = True, receipt_hold_s: float = 1.0) -> None:
        self.config = config
        self.clock = clock or RealClock()
        self.coordinator = Coordinator(config, store, self.clock, server=server)  # None: an experiment's (tests)
        self.telemetry = telemetry or Telemetry(self.clock)
        self.on_round = on_round
        self.eval_timeout_s = eval_timeout_s
        self.crash_after_round = crash_after_round
        self.max_message_bytes = max_message_bytes or transport_limit(config)  # None: derived from the job
        # with TLS, gRPC listens on loopback behind a door that names the peer of every failed handshake
        self.door = TlsDoor(address) if tls is not None and tls_door else None
        self.rpc = RpcServer("127.0.0.1:0" if self.door else address, token=token, tls=tls,
                             max_message_bytes=self.max_message_bytes)
        # with a client CA, a caller is the client its certificate names, whatever its payload claims
        self.require_identity = (tls is not None and tls.client_ca is not None) if require_identity is None \
            else require_identity
        for name in ("job", "submit", "evaluate", "status"):
            self.rpc.unary(name, getattr(self, f"_{name}"))
        self.rpc.stream("join", self._join)
        self.rpc.bidi("session", self._session)
        self._queues: dict[int, SessionQueue] = {}
        self._generation: dict[int, int] = {}
        self._changed = asyncio.Event()  # something happened that may end a wait
        self._eval_results: dict[int, float] = {}
        self._eval_asked: set[int] = set()
        self._received: set[int] = set()  # clients whose update got an "accepted" receipt this round
        self.receipts, self.earnings = Receipts(receipt_hold_s), Earnings()  # when receipts leave; pay over the job
        self.held = HeldBack(log)  # the round lines, printed once the next tasks are out
        self.linger_s = linger_s  # after the job: how long to wait for away clients to come back and hear "done"
        self._told_done: set[int] = set()
        self.outcomes: list[RoundOutcome] = []
        self.activity = ClientActivity(heartbeat_s, heartbeat_misses)  # heartbeats, busy clients, late work

    # -- handlers ----------------------------------------------------------------------------------
    async def _job(self, payload: Any, call: CallContext) -> dict:
        return {"task": self.coordinator.server.task(), "train": self.config.to_dict()["train"],
                "strategy": self.config.strategy, "rounds": self.config.rounds, "seed": self.config.seed}

    async def _status(self, payload: Any, call: CallContext) -> dict:
        plan = self.coordinator.open_round
        return {"round": self.coordinator.round, "open_round": plan.round if plan else None,
                "registered": sorted(self.coordinator.clients), "connected": sorted(self._queues),
                "done": self.coordinator.finished}

    def _check_identity(self, call: CallContext, cid: int) -> None:
        if not self.require_identity:
            return
        if call.identity is None:
            raise RpcError(StatusCode.UNAUTHENTICATED, "this server needs a client certificate (fl-server certs)")
        if call.identity != str(cid):
            log.warning("refused %s from %s: its certificate is for client %s, it claimed client %d",
                        call.method, self._peer(call), call.identity, cid)
            raise RpcError(StatusCode.PERMISSION_DENIED,
                           f"this certificate is for client {call.identity}; it cannot act as client {cid}")

    async def _session(self, requests, call: CallContext):
        try:
            hello = await anext(requests)
        except StopAsyncIteration:
            return
        cid = field(hello, "client_id", int)
        self._check_identity(call, cid)
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
                if field(update, "client_id", int) != cid:
                    raise RpcError(StatusCode.INVALID_ARGUMENT, f"this session belongs to client {cid}")
                self.activity.message(cid, self.clock.now())
                if update.get("type") == "heartbeat":
                    self.activity.heartbeat(cid, self.clock.now(), update)
                    self._poke()
                    continue
                receipt = {"type": "receipt", "round": update["round"], **self._take_update(update)}
                if (queue := self._queues.get(cid)) is not None:
                    self.receipts.send(queue, receipt, self._closes_round(receipt["round"]))
        except RpcError as e:  # garbage or a bad message ends this client's session, not the job
            queue = self._queues.get(cid)
            if queue is not None:
                queue.put_nowait(e)

    async def _join(self, payload: Any, call: CallContext):
        cid = field(payload, "client_id", int)
        self._check_identity(call, cid)
        info = {"num_samples": field(payload, "num_samples", int),
                "local_only_accuracy": float(field(payload, "local_only_accuracy", (int, float))),
                "declared_attack": str(payload.get("declared_attack", "none"))}
        if "shapes" in payload:  # the client's model; the coordinator refuses one that differs from the job's
            info["shapes"] = payload["shapes"]
        old = self._queues.get(cid)
        if old is not None and self.activity.alive(cid, self.clock.now()):
            log.warning("refused a second session for client %d from %s: its live session keeps it", cid,
                        self._peer(call))
            raise RpcError(StatusCode.ALREADY_EXISTS, f"client {cid} already has a live session (its certificate is "
                                                      "in use); this one is refused")
        try:
            self.coordinator.register(cid, info)
        except ValueError as e:
            raise RpcError(StatusCode.INVALID_ARGUMENT, str(e)) from None
        generation = self._generation.get(cid, 0) + 1
        self._generation[cid] = generation
        if old is not None:
            old.put_nowait(None)  # a rejoin supersedes the old stream
            # ... and whatever that stream was doing this round is lost: do not wait for it until the deadline
            self.coordinator.drop(cid, "reconnected mid-round (the old stream was dropped)")
        queue = SessionQueue(batches=payload.get("batches") is True)  # its client reads batch messages
        self._queues[cid] = queue
        peer = self._peer(call)
        self.telemetry.event("join", client=cid, peer=peer)
        log.info("client %d joined from %s%s", cid, peer, " (rejoined)" if old is not None else "")
        self._poke()
        self.activity.joined(cid)
        try:
            yield {"type": "welcome", "round": self.coordinator.round, "heartbeat_s": self.activity.every_s}
            if self.coordinator.finished:
                self._told_done.add(cid)
                self._poke()
                yield {"type": "done", **Books.read(self.coordinator.ledger).of(cid)}
                return
            while True:
                items = await next_messages(queue)
                messages = [m for m in items if isinstance(m, dict)]  # only the last item may be a None/RpcError
                if messages:
                    yield messages[0] if len(messages) == 1 else {"type": "batch", "messages": messages}
                if isinstance(items[-1], RpcError):
                    raise items[-1]
                if items[-1] is None or items[-1]["type"] == "done":
                    return
        finally:
            if self._generation.get(cid) == generation:
                self._queues.pop(cid, None)
                self.coordinator.drop(cid, "connection lost")
                self.telemetry.event("leave", client=cid)
                log.info("client %d left (%s)", cid, peer)
                self._poke()

    async def _submit(self, payload: Any, call: CallContext) -> dict:
        self._check_identity(call, field(payload, "client_id", int))
        return self._take_update(payload)

    def _take_update(self, payload: Any) -> dict:
        cid = field(payload, "client_id", int)
        round_num = field(payload, "round", int)
        late = self.activity.late(cid, round_num, payload.get("metrics"), self.clock.now())
        if late is not None:
            observe_late(self.coordinator.strategy.selector, cid, late)
            self.telemetry.event("late_update", client=cid, round=round_num, received_s=late)
            log.info("late update from client %d for round %d (after its deadline): wasted, not used", cid, round_num)
            self._poke()
            return {"accepted": False, "reason": f"late: round {round_num} closed at its deadline before this update "
                                                 "arrived; not used, not paid"}
        metrics = self.activity.timed(cid, round_num, payload.get("metrics"), self.clock.now())
        accepted, reason = self.coordinator.submit(cid, round_num, payload.get("weights"), metrics)
        if not accepted:
            log.warning("rejected update from client %d in round %d: %s", cid, round_num, reason)
            self.telemetry.event("rejected", client=cid, round=round_num, reason=reason)
        else:
            self._received.add(cid)
        self._poke()
        return {"accepted": accepted, "reason": reason}

    async def _evaluate(self, payload: Any, call: CallContext) -> dict:
        cid = field(payload, "client_id", int)
        self._check_identity(call, cid)
        acc = float(field(payload, "accuracy", (int, float)))
        # these numbers set the consumers' refunds: only in range, only when asked, once per client
        if not 0 <= acc <= 1:  # also refuses NaN
            raise RpcError(StatusCode.INVALID_ARGUMENT, f"accuracy {acc} is outside [0, 1]")
        if cid not in self._eval_asked:
            raise RpcError(StatusCode.FAILED_PRECONDITION, f"no final evaluation was asked of client {cid}")
        if cid in self._eval_results:
            raise RpcError(StatusCode.ALREADY_EXISTS, f"client {cid} already reported its final accuracy")
        self._eval_results[cid] = acc
        self._poke()
        return {"ok": True}

    # -- driving rounds ----------------------------------------------------------------------------
    def _poke(self) -> None:
        self._changed.set()

    def available(self) -> list[int]:
        """Connected clients that can take a task now: not busy with an earlier one, heartbeat fresh."""
        return self.activity.available(list(self._queues), self.clock.now())

    async def _wait(self, condition, deadline: float | None) -> bool:
        """Wait until condition() holds (True) or the clock passes deadline (False)."""
        while not condition():
            self._changed.clear()
            remaining = None if deadline is None else deadline - self.clock.now()
            if remaining is not None and remaining <= 0:
                return False
            try:  # asyncio.timeout, not wait_for: no task per wait, and the wake-up is one loop pass sooner
                async with asyncio.timeout(remaining):
                    await self._changed.wait()
            except TimeoutError:
                return condition()
        return True

    def _closes_round(self, round_num: int) -> bool:
        plan = self.coordinator.open_round
        return plan is not None and plan.round == round_num and not self.coordinator.waiting_for()

    def _peer(self, call: CallContext) -> str:
        """The client's address (behind the TLS door, gRPC sees the door's)."""
        return self.door.real_peer(call.peer) if self.door is not None else call.peer

    async def start(self) -> int:
        port = await self.rpc.start()
        if self.door is None:
            return port
        try:
            return await self.door.start(port)
        except OSError as e:
            await self.rpc.stop(0)
            raise RpcError(StatusCode.UNAVAILABLE, f"cannot listen on {self.door.host}:{self.door.port}: "
                                                   f"{e.strerror or e}") from None

    async def _rounds(self, registration_timeout_s: float | None) -> None:
        c = self.coordinator
        while not c.done:
            await self._await_quorum(registration_timeout_s)
            self.held.hold()  # the round lines wait until the tasks are out (as from each round's close)
            start = self.clock.now()
            available = self.available()
            plan = c.begin_round(available, start)
            # the coordinator's deadline: the scheduler's round_deadline, capped by --round-timeout
            deadline, deadline_s = plan.deadline, plan.deadline - start
            self._received = set()
            self.telemetry.event("round_start", round=plan.round, selected=plan.selected,
                                 connected=sorted(self._queues), available=available, deadline_s=deadline_s)
            self.held.info("round %d: selected %s of %d available (%d connected); deadline %.3gs", plan.round,
                           plan.selected, len(available), len(self._queues), deadline_s)
            weights = encoded_arrays(plan.weights)  # serialised once, not once per client's task
            for cid in plan.selected:
                self.activity.task_sent(cid, plan.round, self.clock.now())
                self._queues[cid].put_nowait({"type": "train", "round": plan.round, "weights": weights,
                                              "train": plan.train, "seed": plan.seeds[cid]})
            await asyncio.sleep(0)  # the tasks leave (every session's handler writes its own), then what was held
            self.held.release()
            await self._wait(lambda: not c.waiting_for(), deadline)
            collected = self.clock.now()
            self.held.hold()
            self.receipts.flush()  # no await until the round's end and the next task: they leave together
            outcome = c.finish_round(collected - start)
            outcome.phases = {"collect_s": collected - start, **outcome.phases}
            self.outcomes.append(outcome)
            self.activity.round_closed(outcome.round, [r.client_id for r in outcome.with_status("failed")])
            self.telemetry.event("round_end", **outcome.to_record(), deadline_s=deadline_s, available=available,
                                 scheduling=scheduling_record(c.strategy.selector), wasted=dict(self.activity.wasted),
                                 resources={str(k): v for k, v in sorted(self.activity.resources.items())})
            self.telemetry.observe("round_s", outcome.duration_s)
            self._tell_round_end(outcome)
            if self.on_round:
                self.on_round(outcome)
            if self.crash_after_round is not None and outcome.round >= self.crash_after_round:
                self.held.release()
                log.error("crashing after round %d (fault injection)", outcome.round)
                os._exit(3)  # like a kill: the round is committed, nothing else is

    async def serve(self, registration_timeout_s: float | None = None) -> None:
        """Run the remaining rounds, the final evaluation and reimbursement, then tell clients we are done."""
        try:
            await self._rounds(registration_timeout_s)
        finally:
            self.held.release()
        if not (c := self.coordinator).finished:
            await self._final_evaluation()
        books = Books.read(c.ledger)
        for cid, queue in list(self._queues.items()):
            queue.put_nowait({"type": "done", **books.of(cid)})  # the final balance and earnings, from the ledger
            self._told_done.add(cid)
        # stay a little for clients that are away (reconnecting after a lost connection), so they hear the job is
        # done instead of retrying against a closed port until they give up
        await self._wait(lambda: not self._queues and self._told_done >= set(c.clients),
                         self.clock.now() + self.linger_s)

    async def _await_quorum(self, registration_timeout_s: float | None) -> None:
        """Wait for min_clients connected clients (failing after the timeout), then up to fill_timeout_s
        for per_round of them, so clients joining at start-up or after a restart are not left out."""
        need, full = self.config.wait_for, min(self.config.per_round, self.config.data.num_clients)
        if len(self.available()) < max(need, full):
            self.held.release()  # a wait: what the last round's close held back is written now
        deadline = None if registration_timeout_s is None else self.clock.now() + registration_timeout_s
        if not await self._wait(lambda: len(self.available()) >= need, deadline):
            raise RuntimeFailure(f"only {len(self.available())} of the {need} clients a round needs were available "
                                 f"within {registration_timeout_s:g}s before round {self.coordinator.round + 1} "
                                 f"(--min-clients sets how many a round needs; rerun with the same --run-dir "
                                 f"to resume)")
        await self._wait(lambda: len(self.available()) >= full, self.clock.now() + self.config.fill_timeout_s)

    def _tell_round_end(self, outcome: RoundOutcome) -> None:
        """Every connected client hears its balance and what it has earned in the whole job (the ledger's
        numbers, so a client that missed rounds while away is not behind); the selected also hear their verdict
        and pay. A rejection made after the receipt (round checks) is logged here, with its reason."""
        ledger = self.coordinator.ledger
        paid = ledger.totals_by("pay", "payee", since_round=outcome.round - 1)  # the round just committed
        for cid, report in outcome.reports.items():
            if report.status == "rejected" and cid in self._received:
                log.warning("rejected update from client %d in round %d after the round checks: %s",
                            cid, outcome.round, report.reason)
                self.telemetry.event("rejected", client=cid, round=outcome.round, reason=report.reason)
        pay_line = ", ".join(f"{cid}: {paid.get(client_account(cid), 0.0):.4g}" for cid in outcome.selected)
        self.held.info("round %d: paid %s", outcome.round, pay_line or "nobody")
        books = self.earnings.after_round(ledger, paid)  # the ledger's totals, read once and then kept
        for cid, queue in list(self._queues.items()):
            queue.put_nowait(round_end_message(outcome, cid, books, paid))

    async def _final_evaluation(self) -> None:
        c = self.coordinator
        self._eval_results = {}
        asked = sorted(self._queues)
        self._eval_asked = set(asked)
        kept = encoded_arrays(c.kept_weights)  # the model the job keeps
        for cid in asked:
            self._queues[cid].put_nowait({"type": "evaluate", "weights": kept})
        await self._wait(lambda: all(cid in self._eval_results or cid not in self._queues for cid in asked),
                         self.clock.now() + self.eval_timeout_s)
        c.finish_job(dict(self._eval_results))
        self.telemetry.event("job_end", consumer_accuracy=self._eval_results)

    async def stop(self, grace: float = 1.0) -> None:
        for queue in list(self._queues.values()):
            queue.put_nowait(None)
        await self.rpc.stop(grace)
        if self.door is not None:
            await self.door.stop()
