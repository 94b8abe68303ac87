"""Compose a scheduler with another selector that decides who is eligible (TIFF's trust).

`--strategy tiff --scheduler adaptive` means: TIFF's selector (e.g. trusted-random) narrows the
available clients to a pool of `pool_factor x k` providers it is willing to use (its trust and its
exploration decide), and the scheduler picks the k among them by its own knobs. Both learn from
every round; the state is the two states side by side.
"""
from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

from mlsyskit.core.config import require
from mlsyskit.tools.fl.outcome import RoundOutcome
from mlsyskit.tools.fl.selection.base import Selector


class GatedScheduler(Selector):
    name = "gated"

    def __init__(self, gate: Selector, scheduler: Selector, pool_factor: int = 3) -> None:
        require(pool_factor >= 1, "pool_factor must be >= 1")
        super().__init__(None)
        self.gate, self.scheduler, self.pool_factor = gate, scheduler, pool_factor

    def select(self, round_num: int, available: Sequence[int], k: int, rng: random.Random) -> list[int]:
        pool = self.gate.select(round_num, available, self.pool_factor * k, rng)
        return self.scheduler.select(round_num, pool, k, rng)

    def round_deadline(self, selected: Sequence[int]) -> float | None:
        deadline = getattr(self.scheduler, "round_deadline", None)
        return deadline(selected) if deadline is not None else None

    def observe(self, outcome: RoundOutcome) -> None:
        self.gate.observe(outcome)
        self.scheduler.observe(outcome)

    def register_clients(self, samples: Mapping[int, int]) -> None:
        self.gate.register_clients(samples)
        self.scheduler.register_clients(samples)

    def state_dict(self) -> dict[str, Any]:
        return {"gate": self.gate.state_dict(), "scheduler": self.scheduler.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.gate.load_state_dict(state["gate"])
        self.scheduler.load_state_dict(state["scheduler"])
