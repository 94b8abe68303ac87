"""Incentive interface: turns a finished round into ledger transfers (pure: balances in, transfers out)."""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping

from mlsyskit.tools.fl.config import EconomyConfig
from mlsyskit.tools.fl.incentive.ledger import ESCROW, INFRA, Transfer, client_account
from mlsyskit.tools.fl.outcome import RoundOutcome


class Incentive(ABC):
    name = "incentive"

    def __init__(self, config: EconomyConfig) -> None:
        self.config = config

    def collect(self, consumers: list[int], balances: Mapping[str, float]) -> tuple[list[Transfer], float]:
        """Every consumer pays the round price into escrow (what it has, if less); the infrastructure
        takes its fee. Returns the transfers and the provider pot left in escrow."""
        transfers, escrow = [], 0.0
        for cid in consumers:
            amount = min(self.config.price, max(balances.get(client_account(cid), 0.0), 0.0))
            if amount > 0:
                transfers.append(Transfer(client_account(cid), ESCROW, amount, "price"))
                escrow += amount
        fee = escrow * self.config.infra_fee
        transfers.append(Transfer(ESCROW, INFRA, fee, "fee"))
        return transfers, escrow - fee

    @abstractmethod
    def pay_providers(self, outcome: RoundOutcome, pot: float) -> list[Transfer]:
        """Distribute `pot` from escrow; whatever is not paid must move to the pool (escrow ends empty)."""

    def reimburse(self, pool: float, paid: Mapping[int, float], uir: Mapping[int, float]) -> list[Transfer]:
        """Refund consumers from the pool; the default economy refunds nothing."""
        return []
