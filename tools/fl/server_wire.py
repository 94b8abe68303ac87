"""fl-server's wire details: the transport limit, field checks, and what a client hears after a round.

A client's balance and earnings come from the ledger every time (`Books`), never from a sum the
client keeps: a client that was away for rounds (a lost connection, a server restart) hears the
same totals as the ledger holds.
"""
from __future__ import annotations

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


def round_end_message(outcome: RoundOutcome, cid: int, books: Books, paid: dict[str, float]) -> dict[str, Any]:
    message = {"type": "round_end", "round": outcome.round, "accuracy": outcome.global_metrics.get("accuracy"),
               **books.of(cid)}
    report = outcome.reports.get(cid)
    if report is not None:
        message.update(status=report.status, reason=report.reason, aggregated=report.aggregated,
                       paid=paid.get(client_account(cid), 0.0))
    return message
