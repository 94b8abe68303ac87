"""TIFF selection: exploit the providers with the best quality history, explore at random.

Each slot of the round is filled by exploration with probability eps_t, else by the best
remaining client by history, where
    eps_t = max(eps_min, eps_0 * decay ** (t - 1))
and history is an EMA  h <- (1 - beta) * h + beta * q  (or the mean of the last `window`
qualities). Clients never seen score `optimistic_quality`, so every client is tried early;
exploration keeps an unlucky first impression from excluding a client forever.
"""
from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from mlsyskit.tools.fl.config import SelectionConfig
from mlsyskit.tools.fl.outcome import RoundOutcome
from mlsyskit.tools.fl.selection.base import Selector


class QualityGreedySelector(Selector):
    name = "quality-greedy"

    def __init__(self, config: SelectionConfig | None = None, tracking: Any = None) -> None:
        super().__init__(config or SelectionConfig())
        self.ema: dict[int, float] = {}
        self.window: dict[int, list[float]] = {}

    def epsilon(self, round_num: int) -> float:
        c = self.config
        return max(c.epsilon_min, c.epsilon * c.epsilon_decay ** max(round_num - 1, 0))

    def score(self, client_id: int) -> float:
        if self.config.history == "window":
            seen = self.window.get(client_id)
            return sum(seen) / len(seen) if seen else self.config.optimistic_quality
        return self.ema.get(client_id, self.config.optimistic_quality)

    def select(self, round_num: int, available: Sequence[int], k: int, rng: random.Random) -> list[int]:
        remaining = sorted(available)
        # best first; ties broken by a per-round random key so equal scores rotate fairly
        tie = {cid: rng.random() for cid in remaining}
        ranked = sorted(remaining, key=lambda cid: (-self.score(cid), tie[cid]))
        eps = self.epsilon(round_num)
        chosen: list[int] = []
        for _ in range(min(k, len(remaining))):
            if rng.random() < eps:
                pick = rng.choice(ranked)
            else:
                pick = ranked[0]
            ranked.remove(pick)
            chosen.append(pick)
        return sorted(chosen)

    def observe(self, outcome: RoundOutcome) -> None:
        beta = self.config.ema_beta
        for report in outcome.reports.values():
            if report.status == "failed":
                continue  # a crash says nothing about data quality
            quality = report.pay_quality if report.status == "valid" else 0.0
            cid = report.client_id
            self.ema[cid] = quality if cid not in self.ema else (1 - beta) * self.ema[cid] + beta * quality
            self.window[cid] = (self.window.get(cid, []) + [quality])[-self.config.window:]

    def state_dict(self) -> dict[str, Any]:
        return {"ema": {str(k): v for k, v in self.ema.items()},
                "window": {str(k): v for k, v in self.window.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.ema = {int(k): float(v) for k, v in state.get("ema", {}).items()}
        self.window = {int(k): list(v) for k, v in state.get("window", {}).items()}
