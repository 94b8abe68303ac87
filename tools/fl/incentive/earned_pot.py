"""TIFF's pay rule with the pot earned by verified work: what a rejected or under-floor update forfeits goes
to the providers whose work the server verified, not to the consumers' refund pool.

Per round t, with S the selected providers, P the paid set (valid, verified quality q > 0 and at or
above the round's floor, as TiffTokens.paid_set) and D the providers that delivered an update (valid
or rejected; the others failed: crashed, disconnected or missed the deadline):

    delivered pot  R_D = R * |D| / |S|          (one slot of R / |S| per provider that delivered)
    pay_p = R_D * w_p / sum_{j in P} w_j,       w_p = n_p * q_p ** gamma

while the global model beats chance (outcome.pay_by_quality); before, quality is noise, so w_p = 1:
the paid set shares the delivered pot equally.
    forfeit = R - sum_p pay_p                    (escrow -> refund pool)

So the pool gets the slots of work that never arrived, and the whole pot of a round whose updates the
server verified none of; TiffTokens (the slot rule this replaces) also forfeited the slots of rejected
and under-floor updates.

Why (measured, docs/tiff.md): the verifier cannot tell an honest update under strong label skew from
a harmful one every time. On breast-cancer (two classes; most clients hold one) about half of the
honest updates point away from the server's reference and were refused, so under the slot rule
honest providers earned 0.58-0.80x of FedAvg's equal pay while attackers earned almost nothing: the
tokens the attackers lost went to the consumers, not to the honest providers. Under this rule a
wrongly refused honest update only moves its slot to other verified (mostly honest) providers, so
honest pay no longer rests on the verifier being right about every honest update; attackers still
earn only what their own verified quality earns. It adds no constant.

Before the model beats chance this rule used to pay each paid provider one slot and forfeit the rest
(nobody's work could be told apart). That forfeited the slots of the honest updates under the
pre-chance floor, on MNIST-1D with no attacker at all, so honest providers earned 0.875-1.00x of
FedAvg's pay (issue 21). The paid set before chance is still the verified, bounded updates at or
above the trust bar, so a scaled or refused update earns nothing more than it did.
"""
from __future__ import annotations

from mlsyskit.tools.fl.incentive.ledger import ESCROW, POOL, Transfer, client_account
from mlsyskit.tools.fl.incentive.tiff_tokens import TiffTokens
from mlsyskit.tools.fl.outcome import RoundOutcome


class EarnedPot(TiffTokens):
    name = "tiff-earned"

    def pay_providers(self, outcome: RoundOutcome, pot: float) -> list[Transfer]:
        paid = self.paid_set(outcome)
        delivered = sum(r.status != "failed" for r in outcome.reports.values())
        if outcome.pay_by_quality:
            weights = {r.client_id: r.num_samples * r.pay_quality ** self.config.quality_exponent for r in paid}
        else:  # the model is not better than chance yet, so quality is noise: equal shares
            weights = {r.client_id: 1.0 for r in paid}
        total = sum(weights.values())
        if total <= 0 or delivered == 0:
            return [Transfer(ESCROW, POOL, pot, "forfeit")]
        earned = pot * delivered / max(len(outcome.selected), 1)
        transfers = [Transfer(ESCROW, client_account(cid), earned * w / total, "pay")
                     for cid, w in sorted(weights.items())]
        transfers.append(Transfer(ESCROW, POOL, max(0.0, pot - sum(t.amount for t in transfers)), "forfeit"))
        return transfers
