"""Optimus' online estimate of a job's total work from its training loss (Peng et al., EuroSys'18).

Optimus models the loss after k steps as `l(k) = 1 / (b0 k + b1) + b2` and fits it to the loss
the job has reported so far; the job is done when l reaches its convergence target, so the
remaining work is the k solving l(k) = target minus the work done. We fit on samples instead of
steps (the batch is fixed, so the two are proportional). The fit is the paper's form; the solver
is ours: for a grid of asymptotes b2 below the smallest loss seen, 1 / (l - b2) is linear in k
(least squares, b0 > 0, b1 > 0), and the b2 with the smallest squared error in loss wins.
"""
from __future__ import annotations

import math

import numpy as np

MIN_REPORTS = 3
GRID = 24


def fit(points: list[tuple[float, float]]) -> tuple[float, float, float] | None:
    """(b0, b1, b2) fitted to (samples, loss) points, or None with too few or unusable points."""
    if len(points) < MIN_REPORTS:
        return None
    k = np.array([p[0] for p in points], dtype=float)
    loss = np.array([p[1] for p in points], dtype=float)
    if not (np.all(np.isfinite(loss)) and np.ptp(k) > 0):
        return None
    lowest = float(loss.min())
    if lowest <= 0:
        return None
    # All asymptotes at once: for each b2, ordinary least squares of y = 1 / (l - b2) on k.
    b2 = np.linspace(0.0, lowest * 0.995, GRID)[:, None]
    y = 1.0 / (loss[None, :] - b2)
    k_mean, y_mean = k.mean(), y.mean(axis=1, keepdims=True)
    slope = ((k - k_mean)[None, :] * (y - y_mean)).sum(axis=1) / ((k - k_mean) ** 2).sum()
    intercept = y_mean[:, 0] - slope * k_mean
    valid = (slope > 0) & (intercept > 0)
    if not valid.any():
        return None
    with np.errstate(divide="ignore", invalid="ignore"):
        pred = 1.0 / (slope[:, None] * k[None, :] + intercept[:, None]) + b2
    err = np.where(valid, ((pred - loss[None, :]) ** 2).sum(axis=1), np.inf)
    best = int(np.argmin(err))
    return float(slope[best]), float(intercept[best]), float(b2[best, 0])


def total_work(points: list[tuple[float, float]], target: float) -> float | None:
    """Samples at which the fitted curve reaches `target`, or None when the fit cannot say."""
    params = fit(points)
    if params is None:
        return None
    b0, b1, b2 = params
    if target <= b2:
        return None  # the fitted curve never gets there
    k = (1.0 / (target - b2) - b1) / b0
    return k if math.isfinite(k) and k > 0 else None
