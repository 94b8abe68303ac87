"""fl-server's wire details: the methods, the transport limit, field checks, batching, and what a client
hears after a round.

RPC methods (msgpack payloads, weights as raw arrays):
  job      unary   -> the task (num_features, num_classes), the TrainSpec (its model target), strategy, rounds
                   and seed: never any data; each client loads its own
  session  bidi    what fl-client uses: its first message registers (as `join`), later ones are its
                   updates (as `submit`); the server sends the `join` tasks, a
                   {"type": "receipt", round, accepted, reason} per update (received or refused at once) and,
                   to every connected client after each round, {"type": "round_end", round, balance, and for
                   the selected: status, reason, aggregated, paid}: the verdict after every check, the truth
                   to print. A session's later messages may also be {"type": "heartbeat", client_id, and resource
                   fields: host_cpu_percent, cpu_percent, load1, memory_available_bytes, cpu_count}, sent every
                   `heartbeat_s` (given in the welcome) while the client is not training. One call for the whole job.
                   A client whose hello says `"batches": true` gets whatever is queued for it at once as one
                   {"type": "batch", "messages": [...]} (in order): its receipt, the round's end and the next
                   task. To such a client a refusal still leaves at once; an accepted receipt leaves with the
                   round's end, or after at most `receipt_hold_s` (1 s) if the round is still open (`Receipts`).
  join     stream  register (num_samples, local-only accuracy) and receive tasks:
                   {"type": "train", round, weights, train, seed} | {"type": "evaluate", weights} | {"type": "done"}
  submit   unary   a round's update + metrics -> {"accepted", "reason"}
  evaluate unary   the consumer's accuracy of the final model on its own test split (once, when asked)
  status   unary   round, registered and connected clients

A client's balance and earnings come from the ledger (`Books`; at a round's end the earnings are the
ledger's totals read once and then that round's pay from the ledger added, `Earnings`), never from a
sum the client keeps: a client that was away for rounds (a lost connection, a server restart) hears
the same totals as the ledger holds.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from mlsyskit.core.rpc import DEFAULT_MAX_MESSAGE_BYTES, RpcError, StatusCode
from mlsyskit.tools.fl.config import JobConfig
from mlsyskit.tools.fl.incentive.ledger import Ledger, client_account
from mlsyskit.tools.fl.outcome import RoundOutcome

ENVELOPE_BYTES = 1 << 20  # room for the msgpack envelope and metrics around an update's arrays


def transport_limit(config: JobConfig) -> int:
    """gRPC's per-message cap for this job: twice the job's update limit plus an envelope (never below
    core.rpc's default). An update over the job's limit must reach validate_update, to be rejected
    with a logged reason and unpaid; if gRPC refused it first, the client would just see a lost connection."""
    return max(DEFAULT_MAX_MESSAGE_BYTES, 2 * config.max_update_bytes + ENVELOPE_BYTES)


def field(payload: Any, name: str, kind: type | tuple[type, ...]) -> Any:
    if not isinstance(payload, dict) or not isinstance(payload.get(name), kind) or isinstance(payload.get(name), bool):
        raise RpcError(StatusCode.INVALID_ARGUMENT, f"field {name!r} is missing or not a {kind}")
    return payload[name]


@dataclass(frozen=True)
class Books:
    balances: dict[str, float]
    earned: dict[str, float]  # pay received over the whole job, per account

    @classmethod
    def read(cls, ledger: Ledger) -> Books:
        return cls(ledger.balances(), ledger.totals_by("pay", "payee"))

    def of(self, cid: int) -> dict[str, float]:
        account = client_account(cid)
        return {"balance": self.balances.get(account, 0.0), "earned": self.earned.get(account, 0.0)}


class Earnings:
    """What each account was paid over the whole job, kept round by round for the round-end messages:
    read from the ledger once, then each committed round's own pay added (pay is written only by a
    round's commit). Reading every round's pay again at every round's end cost O(rounds x clients) on
    the round's critical path (~1 ms of CPU per round after 100 rounds, growing with the job)."""

    def __init__(self) -> None:
        self._totals: dict[str, float] | None = None

    def after_round(self, ledger: Ledger, paid: dict[str, float]) -> Books:
        """The books just after a round committed; `paid` is that round's pay, from the ledger."""
        if self._totals is None:
            self._totals = ledger.totals_by("pay", "payee")  # includes this round's pay
        else:
            for account, amount in paid.items():
                self._totals[account] = self._totals.get(account, 0.0) + amount
        return Books(ledger.balances(), dict(self._totals))


def round_end_message(outcome: RoundOutcome, cid: int, books: Books, paid: dict[str, float]) -> dict[str, Any]:
    message = {"type": "round_end", "round": outcome.round, "accuracy": outcome.global_metrics.get("accuracy"),
               **books.of(cid)}
    report = outcome.reports.get(cid)
    if report is not None:
        message.update(status=report.status, reason=report.reason, aggregated=report.aggregated,
                       paid=paid.get(client_account(cid), 0.0))
    return message


class SessionQueue(asyncio.Queue):
    """What the server has for one session, in order; `batches`: its client reads batch messages."""

    def __init__(self, batches: bool = False) -> None:
        super().__init__()
        self.batches = batches


async def next_messages(queue: SessionQueue) -> list[Any]:
    """The next item of a session's queue and, for a client that reads batches, every other item queued by
    now, so a round's receipts, its end and the next task leave as one wire message (one write and one read
    instead of three on each side). Ends at a control item (None: the session ends; an RpcError: it
    fails) or at "done", the last message a session carries; the order is the queue's."""
    items = [await queue.get()]
    while queue.batches and isinstance(items[-1], dict) and items[-1]["type"] != "done" and not queue.empty():
        items.append(queue.get_nowait())
    return items


class Receipts:
    """When a receipt leaves (the verdict in it is made when the update arrives, and never changes).

    A refusal leaves at once. An accepted update's receipt to a client that reads batches waits for
    the round's close (`flush`, just before the round's end and the next task, in the same wire
    message) or `hold_s`, whichever comes first; so does the receipt of the update that closes the
    round, for every client (serve() flushes it at once). A session's messages keep their order: a
    receipt sent at once first releases the ones held for that session."""

    def __init__(self, hold_s: float) -> None:
        self.hold_s = hold_s
        self._held: dict[int, tuple[SessionQueue, dict, asyncio.TimerHandle | None]] = {}
        self._count = 0

    def send(self, queue: SessionQueue, receipt: dict, closes_round: bool) -> None:
        if not closes_round and not (queue.batches and receipt["accepted"]):
            self._release(lambda q: q is queue)
            queue.put_nowait(receipt)
            return
        self._count += 1
        key = self._count
        timer = None if closes_round else asyncio.get_running_loop().call_later(
            self.hold_s, self._release, lambda q: q is queue)
        self._held[key] = (queue, receipt, timer)

    def flush(self) -> None:
        """Every held receipt, now (the round closed)."""
        self._release(lambda q: True)

    def _release(self, which) -> None:
        for key, (queue, receipt, timer) in list(self._held.items()):
            if which(queue):
                del self._held[key]
                if timer is not None:
                    timer.cancel()
                queue.put_nowait(receipt)


class HeldBack:
    """The server's round lines (rich, ~0.3 ms of CPU each), printed at once or, between a round's close and
    the moment the next round's tasks have left (`hold` .. `release`), after it, in order, so they cost the
    clients no time before their next training. Telemetry events are not held: a round's start is in the
    log before any client can have its task, and a committed round's end right after its commit."""

    def __init__(self, logger: logging.Logger) -> None:
        self._log = logger
        self._held: list[tuple] | None = None  # None: not holding

    def hold(self) -> None:
        if self._held is None:
            self._held = []

    def info(self, message: str, *args: Any) -> None:
        if self._held is None:
            self._log.info(message, *args)
        else:
            self._held.append((message, *args))

    def release(self) -> None:
        held, self._held = self._held or [], None
        for line in held:
            self._log.info(*line)
