"""TIFF's pay rule with the pot earned by verified work: what a rejected or under-floor update forfeits goes
to the providers whose work the server verified, not to the consumers' refund pool.

Per round t, with P the paid set (valid, verified quality q > 0 and at or above the round's floor, as
TiffTokens.paid_set) and R the round's provider pot:

    pay_p = R * w_p / sum_{j in P} w_j,         w_p = n_p * q_p ** gamma

while the global model beats chance (outcome.pay_by_quality); before, quality is noise, so w_p = 1:
the paid set shares the pot equally.
    forfeit = R - sum_p pay_p                    (escrow -> refund pool)

So the pool gets only the whole pot of a round whose updates the server verified none of; TiffTokens
(the slot rule this replaces) also forfeited the slots of rejected and under-floor updates. The slots
of providers that did not deliver (late, crashed) go to the paid set too, as FedAvg's equal pay gives
the whole pot to whoever delivered: refunding them to consumers cost honest providers up to 15% of
FedAvg's pay on MNIST-1D without any attacker (deadline failures, issue 21).

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
        if outcome.pay_by_quality:
            weights = {r.client_id: r.num_samples * r.pay_quality ** self.config.quality_exponent for r in paid}
        else:  # the model is not better than chance yet, so quality is noise: equal shares
            weights = {r.client_id: 1.0 for r in paid}
        total = sum(weights.values())
        if total <= 0:
            return [Transfer(ESCROW, POOL, pot, "forfeit")]
        transfers = [Transfer(ESCROW, client_account(cid), pot * w / total, "pay")
                     for cid, w in sorted(weights.items())]
        transfers.append(Transfer(ESCROW, POOL, max(0.0, pot - sum(t.amount for t in transfers)), "forfeit"))
        return transfers
