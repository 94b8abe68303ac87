"""Uniform random selection (FedAvg's default and the TIFF paper's baseline)."""
from __future__ import annotations

import random
from collections.abc import Sequence

from mlsyskit.tools.fl.selection.base import Selector


def random_order(available: Sequence[int], rng: random.Random) -> list[int]:
    """Every available client in a uniformly random order: the first k are FedAvg's selection. TIFF's
    selector walks the same order (skipping distrusted clients), so with the same round rng both pick the
    same clients while nobody is distrusted and a comparison measures TIFF's decisions, not selection luck."""
    return rng.sample(sorted(available), len(available))


class RandomSelector(Selector):
    name = "random"

    def select(self, round_num: int, available: Sequence[int], k: int, rng: random.Random) -> list[int]:
        return sorted(random_order(available, rng)[:k])
