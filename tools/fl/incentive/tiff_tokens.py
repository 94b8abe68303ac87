"""TIFF's token economy: pay providers by data quality, starve bad data, refund consumers by utility.

Per round (formulas in docs/tiff.md):
  * every selected provider holds one slot worth  pot / K  (K = number selected);
  * slots of providers that failed, were rejected, or scored below the round's quality floor
        floor_t = quality_floor * median{ q_p : p valid in round t }
    are forfeited to the reimbursement pool (the floor is relative to the round, ours: the first
    global model is random, so an absolute floor would reject everyone and never bootstrap);
  * the remaining  pot * |P| / K  is shared among the paid set P in proportion to
        w_p = n_p * q_p ** gamma      (n = samples, q = quality, gamma = quality_exponent),
    where q is the server-verified quality when there is one (incentive/verify.py), and equally
    while the global model does not beat chance yet (outcome.pay_by_quality False; the floor is then
    PRE_CHANCE_FLOOR x median instead).
At reimbursement time the pool is refunded to consumers with weights
        v_c = paid_c / (1 + max(0, UIR_c)),   refund_c = min(paid_c, pool * v_c / sum v),
so consumers who gained less from the federation get more of their payment back.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from statistics import median

from mlsyskit.tools.fl.incentive.base import Incentive
from mlsyskit.tools.fl.incentive.ledger import ESCROW, POOL, Transfer, client_account
from mlsyskit.tools.fl.outcome import RoundOutcome

PRE_CHANCE_FLOOR = 0.5  # x median, before the model beats chance: the selector's trust bar (TRUST_FRACTION)


def quality_threshold(outcome: RoundOutcome, floor: float) -> float:
    """The round's quality floor: a fraction of the median quality of its valid updates. Before the model beats
    chance (outcome.pay_by_quality False) pay is equal, so quality cannot weigh an update down; the floor is then
    the bar the selector trusts a client by, so a weak update (a liar's 20% true labels) is not paid a full
    slot (measured: tests/fl/test_pay_verified.py)."""
    qualities = [r.pay_quality for r in outcome.with_status("valid")]
    fraction = floor if outcome.pay_by_quality else max(floor, PRE_CHANCE_FLOOR)
    return fraction * float(median(qualities)) if qualities else 0.0


class TiffTokens(Incentive):
    name = "tiff"

    def paid_set(self, outcome: RoundOutcome) -> list:
        floor = quality_threshold(outcome, self.config.quality_floor)
        return [r for r in outcome.with_status("valid") if r.pay_quality >= floor and r.pay_quality > 0]

    def pay_providers(self, outcome: RoundOutcome, pot: float) -> list[Transfer]:
        paid = self.paid_set(outcome)
        slot = pot / max(len(outcome.selected), 1)
        if outcome.pay_by_quality:
            weights = {r.client_id: r.num_samples * r.pay_quality ** self.config.quality_exponent for r in paid}
        else:  # the model is not better than chance yet, so quality is noise: one slot each
            weights = {r.client_id: 1.0 for r in paid}
        total = sum(weights.values())
        if total <= 0:
            return [Transfer(ESCROW, POOL, pot, "forfeit")]
        paid_pot = slot * len(paid)
        transfers = [Transfer(ESCROW, client_account(cid), paid_pot * w / total, "pay")
                     for cid, w in sorted(weights.items())]
        transfers.append(Transfer(ESCROW, POOL, max(0.0, pot - sum(t.amount for t in transfers)), "forfeit"))
        return transfers

    def reimburse(self, pool: float, paid: Mapping[int, float], uir: Mapping[int, float]) -> list[Transfer]:
        weights = {cid: amount / (1.0 + max(0.0, uir.get(cid, 0.0))) for cid, amount in paid.items() if amount > 0}
        total = sum(weights.values())
        if pool <= 0 or total <= 0:
            return []
        refunds = {cid: min(paid[cid], pool * w / total) for cid, w in sorted(weights.items())}
        # float rounding can make the shares add up to a hair over the pool: take that from the largest.
        # The budget is one step under `pool`, itself the rounded sum of the pool's rows, so the pool's
        # exact balance stays >= 0 too
        budget = math.nextafter(pool, 0.0)
        largest = max(refunds, key=refunds.get)
        for _ in range(8):  # one step almost always does it; the subtraction itself can round up
            excess = math.fsum(refunds.values()) - budget
            if excess <= 0:
                break
            refunds[largest] = max(0.0, math.nextafter(refunds[largest] - excess, 0.0))
        return [Transfer(POOL, client_account(cid), amount, "refund") for cid, amount in refunds.items()]
