"""Statistical efficiency of a batch size (Pollux, OSDI'21): the formula and the batch limits that
the simulator and a goodput-aware policy share (the hidden noise scales are in ground_truth.py).

A job trains with global batch M. Per sample it progresses `gain(phi, B0, M) = (phi + B0) /
(phi + M)` times as far as at its submitted batch B0, where phi is the job's gradient noise scale
(samples; Pollux's E(M) = (phi + M0) / (phi + M), taken relative to B0). A job's work is counted
in samples at B0 (`JobSpec.work`), so a job kept at B0 (every baseline) runs exactly as before;
a bigger batch processes more samples per second but each counts less, and a smaller one the
other way round. phi grows as training converges: larger batches are less efficient early.

Each job's true phi (ground_truth.py, the simulator's only) follows its application's trajectory
over its progress, read off the Pollux artifact's validation traces. A policy never reads it: it
gets `JobView.noise_scale`, phi measured with noise at each start and as training moves on (as
PolluxAgent reports gradient statistics), and learns an application's early phi from the jobs it
has run (policies/goodput.py).

`BATCH_RANGE`: the global batches a job may be run with (Pollux's init..max batch per
application, the smallest and largest validated batch sizes of the traces; a job's own batch is
always allowed); `MIN_LOCAL`: the smallest per-GPU batch profiled (placements.csv).
"""
from __future__ import annotations

from functools import cache

BATCH_RANGE = {"bert": (12, 384), "cifar10": (256, 2048), "deepspeech2": (160, 640), "imagenet": (200, 800),
               "ncf": (256, 16_384), "yolov3": (8, 128)}
MIN_LOCAL = {"bert": 4, "cifar10": 32, "deepspeech2": 10, "imagenet": 20, "ncf": 32, "yolov3": 4}


def gain(phi: float, submitted: int, batch: int) -> float:
    """Progress per sample at `batch`, relative to the submitted batch."""
    return (phi + submitted) / (phi + batch)


@cache
def batch_choices(app: str, submitted: int, gpus: int) -> tuple[int, ...]:
    """Global batches worth trying on `gpus` GPUs: the submitted one and powers of two times it
    within the application's range, each at least MIN_LOCAL per GPU."""
    low, high = BATCH_RANGE.get(app, (submitted, submitted))
    low, high = min(low, submitted), max(high, submitted)
    least = MIN_LOCAL.get(app, 1) * gpus
    out = {submitted}
    for j in range(-6, 4):
        m = int(round(submitted * 2.0 ** j))
        if low <= m <= high and m >= least:
            out.add(m)
    return tuple(sorted(out))
