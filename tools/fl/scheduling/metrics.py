"""Scheduling metrics as pure functions over a run's records.

time_to_accuracy: the simulated wall-clock time at the end of the first round whose global
accuracy reached the target (None: never). Jain's index: (sum x)^2 / (n * sum x^2), 1 when all
equal, 1/n when one client has everything; over every client of the population, so clients never
selected count as zeros. worst-10%: the mean accuracy of the worst ceil(10%) of clients (at least
one), which is steadier than a single quantile.
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence

from mlsyskit.core.telemetry import percentile


def time_to_accuracy(round_end_times: Sequence[float], accuracies: Sequence[float], target: float) -> float | None:
    if len(round_end_times) != len(accuracies):
        raise ValueError("need one end time per accuracy")
    for end, accuracy in zip(round_end_times, accuracies, strict=True):
        if accuracy >= target:
            return float(end)
    return None


def jain_index(values: Iterable[float]) -> float:
    xs = [float(v) for v in values]
    if not xs:
        return math.nan
    if any(x < 0 or not math.isfinite(x) for x in xs):
        raise ValueError("Jain's index needs finite non-negative values")
    square_sum = sum(x * x for x in xs)
    if square_sum == 0:
        return 1.0  # nobody got anything: equally
    return sum(xs) ** 2 / (len(xs) * square_sum)


def per_client(population: int, amounts: Mapping[int, float]) -> list[float]:
    """Dense per-client values for clients 0..population-1 (absent clients: 0)."""
    if any(not 0 <= cid < population for cid in amounts):
        raise ValueError("client id outside the population")
    return [float(amounts.get(cid, 0.0)) for cid in range(population)]


def accuracy_spread(accuracies: Sequence[float]) -> dict[str, float]:
    """Population standard deviation, worst-10% mean and 10th percentile of per-client accuracy."""
    if not accuracies:
        return {"std": math.nan, "worst10_mean": math.nan, "p10": math.nan, "mean": math.nan}
    ordered = sorted(float(a) for a in accuracies)
    worst = ordered[:max(1, math.ceil(0.1 * len(ordered)))]
    return {"std": statistics.pstdev(ordered), "worst10_mean": sum(worst) / len(worst),
            "p10": percentile(ordered, 10, presorted=True), "mean": sum(ordered) / len(ordered)}


def work_totals(cpu_s: Mapping[int, float], wasted_cpu_s: Mapping[int, float]) -> dict[str, float]:
    """Total client CPU-seconds and the part wasted on updates that came too late or never."""
    total = sum(cpu_s.values())
    wasted = sum(wasted_cpu_s.values())
    return {"cpu_s": total, "wasted_cpu_s": wasted, "wasted_fraction": wasted / total if total else 0.0}
