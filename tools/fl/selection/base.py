"""Client selection interface: separate from aggregation and from the incentive.

A selector sees who is available and what earlier rounds reported (quality, measured train time
and CPU use, failures) and picks k clients. It is pure: randomness comes from the rng argument
(derived per round from the job seed) and its memory is a plain dict that is checkpointed.
TIFF's selectors (selection/) and the heterogeneity-aware schedulers (scheduling/: TiFL tiers, Oort
utility, ours) all implement it and are found by name in one registry, selectors.SELECTORS.
"""
from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any

from mlsyskit.tools.fl.outcome import RoundOutcome


class Selector(ABC):
    name = "selector"

    def __init__(self, config: Any = None, tracking: Any = None) -> None:
        """Every selector is built the same way (selectors.make_selector): its own config dataclass (None: its
        defaults) and, for the schedulers that track clients, a TrackingConfig (others ignore it)."""
        self.config = config

    @abstractmethod
    def select(self, round_num: int, available: Sequence[int], k: int, rng: random.Random) -> list[int]:
        """Up to k distinct ids from `available`, in a deterministic order for a given rng."""

    def observe(self, outcome: RoundOutcome) -> None:  # noqa: B027 (optional hook)
        """Learn from a finished round."""

    def register_clients(self, samples: Mapping[int, int]) -> None:  # noqa: B027 (optional hook)
        """Clients joined with these training-sample counts (their word; the coordinator's client table). Called
        on every start for every known client, so it is not part of the checkpointed state."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:  # noqa: B027 (stateless by default)
        pass
