"""fl-server's round-end earnings (server_wire.Earnings): read from the ledger once, then each round's pay
added, they must stay what a full read of the ledger says, whatever else the ledger records meanwhile."""
from __future__ import annotations

import random

from mlsyskit.core.storage import MetaStore
from mlsyskit.tools.fl.incentive.ledger import ESCROW, MINT, POOL, Ledger, Transfer, client_account
from mlsyskit.tools.fl.server_wire import Books, Earnings


def _round(ledger: Ledger, round_num: int, rng: random.Random) -> dict[str, float]:
    """A round's commit: prices, refunds and pay to some clients; returns the round's pay, as the server reads it."""
    transfers = [Transfer(client_account(c), ESCROW, rng.uniform(0.1, 2.0), "price") for c in range(6)]
    transfers += [Transfer(ESCROW, client_account(c), rng.uniform(0.0, 3.0), "pay") for c in rng.sample(range(6), 4)]
    transfers += [Transfer(POOL, client_account(rng.randrange(6)), rng.uniform(0.0, 0.5), "refund")]
    ledger.apply(round_num, transfers)
    return ledger.totals_by("pay", "payee", since_round=round_num - 1)


def test_earnings_kept_round_by_round_equal_a_full_read(tmp_path):
    ledger = Ledger(MetaStore(tmp_path / "run.db"))
    ledger.apply(0, [Transfer(MINT, client_account(c), 10.0, "endowment") for c in range(6)])
    rng, earnings = random.Random(0), Earnings()
    for round_num in range(1, 31):
        kept = earnings.after_round(ledger, _round(ledger, round_num, rng))
        full = Books.read(ledger)
        assert kept.balances == full.balances
        assert kept.earned.keys() == full.earned.keys()
        for account, amount in full.earned.items():
            assert abs(kept.earned[account] - amount) < 1e-9, (round_num, account)
        assert all(kept.of(c) == {"balance": full.balances[client_account(c)], "earned": kept.earned.get(
            client_account(c), 0.0)} for c in range(6))
