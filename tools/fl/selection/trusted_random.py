"""TIFF selection with diversity: uniform among trusted clients, plus decaying exploration.

A client is trusted while it is unseen (so everyone is tried early) or while its quality history
(EMA or window, as quality-greedy keeps it; rejected updates count 0, crashes nothing) is at
least TRUST_FRACTION x the median history of the clients seen so far. Each slot is filled with
probability eps_t = max(eps_min, eps_0 * decay ** (t - 1)) by a uniformly random client, else by a
uniformly random trusted one.

Why uniform and not greedy: under label skew the clients whose data look most like the server's
validation split score best, and always taking them starves the other classes. Greedy selection
scored 10.8 points below FedAvg with no attackers at all (issue 11); uniform among the trusted
is FedAvg's selection once the attackers are distrusted.
"""
from __future__ import annotations

import random
from collections.abc import Sequence
from statistics import median

from mlsyskit.tools.fl.selection.quality_greedy import QualityGreedySelector

TRUST_FRACTION = 0.5  # of the median history of seen clients; the same 0.5 as the pay floor


class TrustedRandomSelector(QualityGreedySelector):
    name = "trusted-random"

    def trusted(self, candidates: Sequence[int]) -> list[int]:
        seen = [self.score(c) for c in candidates if c in self.ema]
        bar = TRUST_FRACTION * median(seen) if seen else 0.0
        return [c for c in candidates if c not in self.ema or (self.score(c) >= bar and self.score(c) > 0)]

    def select(self, round_num: int, available: Sequence[int], k: int, rng: random.Random) -> list[int]:
        remaining = sorted(available)
        trusted = self.trusted(remaining)
        eps = self.epsilon(round_num)
        chosen: list[int] = []
        for _ in range(min(k, len(remaining))):
            pool = trusted if trusted and rng.random() >= eps else remaining
            pick = rng.choice(pool)
            remaining.remove(pick)
            if pick in trusted:
                trusted.remove(pick)
            chosen.append(pick)
        return sorted(chosen)
