"""Uniform random selection (FedAvg's default and the TIFF paper's baseline)."""
from __future__ import annotations

import random
from collections.abc import Sequence

from mlsyskit.tools.fl.selection.base import Selector


class RandomSelector(Selector):
    name = "random"

    def select(self, round_num: int, available: Sequence[int], k: int, rng: random.Random) -> list[int]:
        return sorted(rng.sample(sorted(available), min(k, len(available))))
