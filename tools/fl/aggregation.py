"""Update validation, sample-weighted FedAvg and the aggregation-rule interface.

Validation runs on every update before it can be aggregated or paid: it must be for the open
round, from a selected client, with exactly the global model's names, shapes and dtypes, finite,
no larger than the configured byte limit, with sane metrics. What an update is worth (its size
and direction against the server's own reference update) is checked next, also before the
receipt, by the strategy's verifier (incentive/verify.py).

An `Aggregator` turns the admitted updates of a round into the next global model. FedAvg is the
default; the robust rules (coordinate-wise median, trimmed mean, multi-Krum) and the server
optimisers (FedAvgM, FedAdam) live one per file in strategy/, each with its strategy.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from mlsyskit.tools.fl.model import Weights

METRIC_KEYS = ("num_samples", "loss", "quality", "train_time_s", "cpu_time_s")


def validate_update(weights: Any, metrics: Any, reference: Weights, max_bytes: int) -> str | None:
    """None if the update is acceptable, else the reason it is not."""
    if not isinstance(weights, Mapping) or not isinstance(metrics, Mapping):
        return "update must carry a weights map and a metrics map"
    # size first, so an oversized update is refused for its size whatever its names and shapes
    size = sum(array.nbytes for array in weights.values() if isinstance(array, np.ndarray))
    if size > max_bytes:
        return f"update of {size} bytes exceeds the {max_bytes}-byte limit"
    if set(weights) != set(reference):
        return f"weights have names {sorted(map(str, weights))}, expected {sorted(reference)}"
    for name, ref in reference.items():
        array = weights[name]
        if not isinstance(array, np.ndarray):
            return f"{name} is a {type(array).__name__}, not an array"
        if array.shape != ref.shape or array.dtype != ref.dtype:
            return f"{name} has shape {array.shape} {array.dtype}, expected {ref.shape} {ref.dtype}"
        if not np.isfinite(array).all():
            return f"{name} contains NaN or Inf"
    for key in METRIC_KEYS:
        value = metrics.get(key)
        if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value) or value < 0:
            return f"metric {key} is missing or invalid ({value!r})"
    if not 0 <= metrics["quality"] <= 1:
        return f"quality {metrics['quality']} is outside [0, 1]"
    if int(metrics["num_samples"]) < 1:
        return "num_samples must be at least 1"
    return None


def fedavg(updates: Sequence[tuple[Weights, int]]) -> Weights:
    """Sample-weighted average  w = sum_i n_i w_i / sum_i n_i  (McMahan et al. 2017)."""
    if not updates:
        raise ValueError("nothing to aggregate")
    total = float(sum(n for _, n in updates))
    names = updates[0][0].keys()
    return {name: (sum(w[name].astype(np.float64) * (n / total) for w, n in updates)).astype(updates[0][0][name].dtype)
            for name in names}


class Aggregator:
    """An aggregation rule: pure except for a server optimiser's state across rounds (state_dict)."""

    name = "fedavg"

    def aggregate(self, global_weights: Weights, updates: Sequence[tuple[Weights, int]]) -> Weights:
        """The next global model from `updates` ((weights, num_samples), at least one)."""
        return fedavg(updates)

    def see_reference(self, delta: Weights | None) -> None:
        """The server's own update this round per tensor (TIFF's reference, None without one), told before
        aggregate; only rules that take their rate from it (strategy/fedadam.py) keep it."""

    def see_validation(self, score: Callable[[Weights], float]) -> None:
        """The accuracy of a model on the server's validation split (TIFF's, told once); only a rule that picks
        between candidate steps by it (strategy/fedadam.py) keeps it."""

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore what state_dict returned (stateless rules keep nothing)."""


def stacked(updates: Sequence[tuple[Weights, int]], name: str) -> np.ndarray:
    """One parameter of every update, stacked on a new first axis (float64)."""
    return np.stack([np.asarray(w[name], dtype=np.float64) for w, _ in updates])


def like(reference: Weights, arrays: Mapping[str, np.ndarray]) -> Weights:
    """`arrays` cast to the dtypes of `reference`."""
    return {name: np.asarray(arrays[name]).astype(reference[name].dtype) for name in reference}
