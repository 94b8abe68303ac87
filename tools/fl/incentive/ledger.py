"""A double-entry token ledger in SQLite (core.storage MetaStore).

Every movement is one row with a payer, a payee and a non-negative amount, so the sum of all
balances is zero by construction: the `mint` account goes negative by exactly what it issued.
Balances are derived from the rows, never stored separately, so they cannot drift; the rows read
so far are kept per account as the exact running sum of their amounts (Shewchuk's non-overlapping
partials, whose math.fsum is the same correctly rounded total as fsum over every row) and only newer
rows are fetched: a full scan, or an fsum over every row per call, made a round's cost grow with the
job's length. A rolled-back transaction is detected by the highest row number going down, which
discards what was kept.
Writes join the caller's MetaStore transaction, so a round's transfers and its checkpoint
commit together (a crash leaves either both or neither).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from mlsyskit.core.storage import MetaStore

MINT, ESCROW, INFRA, POOL = "mint", "escrow", "infra", "pool"

_DDL = ("CREATE TABLE IF NOT EXISTS fl_ledger (seq INTEGER PRIMARY KEY AUTOINCREMENT, round INTEGER NOT NULL, "
        "payer TEXT NOT NULL, payee TEXT NOT NULL, amount REAL NOT NULL CHECK (amount >= 0), kind TEXT NOT NULL)")


def client_account(client_id: int) -> str:
    return f"client:{client_id}"


def account_client(account: str) -> int | None:
    return int(account.split(":", 1)[1]) if account.startswith("client:") else None


@dataclass(frozen=True)
class Transfer:
    payer: str
    payee: str
    amount: float
    kind: str  # endowment | price | fee | pay | forfeit | refund


class Ledger:
    def __init__(self, store: MetaStore) -> None:
        self.store = store
        store.ensure_table(_DDL)
        self._amounts: dict[str, list[float]] = {}  # account -> exact partials of the rows read so far
        self._read_up_to = 0  # highest row number (seq) in _amounts

    def _last_seq(self) -> int:
        return self.store.query("SELECT COALESCE(MAX(seq), 0) FROM fl_ledger")[0][0]

    def _forget_if_rolled_back(self) -> None:
        # rows we kept were removed by a rollback (seq is reused after one): start over
        if self._last_seq() < self._read_up_to:
            self._amounts, self._read_up_to = {}, 0

    def apply(self, round_num: int, transfers: list[Transfer]) -> None:
        with self.store.transaction():
            self._forget_if_rolled_back()
            for t in transfers:
                if not (t.amount >= 0 and math.isfinite(t.amount)):
                    raise ValueError(f"refusing transfer of {t.amount!r} tokens ({t.kind})")
                if t.amount == 0 or t.payer == t.payee:
                    continue
                self.store.execute("INSERT INTO fl_ledger (round, payer, payee, amount, kind) VALUES (?, ?, ?, ?, ?)",
                                   (round_num, t.payer, t.payee, float(t.amount), t.kind))

    def balances(self) -> dict[str, float]:
        self._forget_if_rolled_back()
        rows = self.store.query("SELECT seq, payer, payee, amount FROM fl_ledger WHERE seq > ? ORDER BY seq",
                                (self._read_up_to,))
        credit = self._amounts
        for seq, payer, payee, amount in rows:
            add_exactly(credit.setdefault(payer, []), -amount)
            add_exactly(credit.setdefault(payee, []), amount)
            self._read_up_to = seq
        return {account: math.fsum(v) for account, v in sorted(credit.items())}

    def balance(self, account: str) -> float:
        return self.balances().get(account, 0.0)

    def total(self) -> float:
        """Sum of all balances; zero up to float rounding when the books balance."""
        return math.fsum(self.balances().values())

    def totals_by(self, kind: str, side: str = "payee", since_round: int = -1) -> dict[str, float]:
        """Amount of `kind` received (side='payee') or paid (side='payer') per account, rounds > since_round."""
        column = "payee" if side == "payee" else "payer"
        rows = self.store.query(f"SELECT {column}, amount FROM fl_ledger WHERE kind=? AND round>? ORDER BY seq",
                                (kind, since_round))
        out: dict[str, list[float]] = {}
        for account, amount in rows:
            out.setdefault(account, []).append(amount)
        return {a: math.fsum(v) for a, v in sorted(out.items())}

    def rows(self) -> list[tuple]:
        return self.store.query("SELECT seq, round, payer, payee, amount, kind FROM fl_ledger ORDER BY seq")

    def digest(self) -> str:
        """A stable fingerprint of every transfer (for determinism checks)."""
        import hashlib

        h = hashlib.sha256()
        for row in self.rows():
            h.update(repr((row[1], row[2], row[3], round(row[4], 12), row[5])).encode())
        return h.hexdigest()


def add_exactly(partials: list[float], x: float) -> None:
    """Add x to partials, non-overlapping floats whose exact sum is the exact sum of every value added
    (Shewchuk's algorithm, the one math.fsum runs inside): a few floats per account, however many rows."""
    i = 0
    for y in partials:
        if abs(x) < abs(y):
            x, y = y, x
        hi = x + y
        lo = y - (hi - x)
        if lo:
            partials[i] = lo
            i += 1
        x = hi
    partials[i:] = [x]
