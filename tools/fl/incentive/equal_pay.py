"""The default economy: every provider with a valid update gets an equal share (no quality weighting)."""
from __future__ import annotations

from mlsyskit.tools.fl.incentive.base import Incentive
from mlsyskit.tools.fl.incentive.ledger import ESCROW, POOL, Transfer, client_account
from mlsyskit.tools.fl.outcome import RoundOutcome


class EqualPay(Incentive):
    name = "equal-pay"

    def pay_providers(self, outcome: RoundOutcome, pot: float) -> list[Transfer]:
        valid = outcome.with_status("valid")
        if not valid:
            return [Transfer(ESCROW, POOL, pot, "forfeit")]
        share = pot / len(valid)
        return [Transfer(ESCROW, client_account(r.client_id), share, "pay") for r in valid]
