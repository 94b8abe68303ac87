"""bench_marble's held-out workloads: a documented generator of Pollux-format workloads (other seeds,
arrival processes and application mixes than the four shipped ones) and windows of the real Philly trace."""
from __future__ import annotations

import csv
import math
import random
from pathlib import Path

from mlsyskit.tools.sched.workloads import APP_BATCHES, PHILLY

PHILLY_MIX = "1:70,2:10,4:10,8:8,16:2"

# The held-out generator. Each workload: (jobs, arrival process, application weights, request
# sizes: "low", "any" or "high" half of each application's plausible GPU counts, APP_REQUESTS).
# The shipped workloads arrive as a Poisson-like stream over 8 h with ncf and cifar10 jobs the
# most common; these use other processes and mixes.
HELDOUT = {
    "heldout-diurnal": (160, "diurnal", {"bert": 3, "cifar10": 3, "deepspeech2": 3, "imagenet": 1, "ncf": 3,
                                         "yolov3": 1}, "any"),
    "heldout-bursty": (160, "bursty", {"bert": 2, "cifar10": 4, "deepspeech2": 2, "imagenet": 1, "ncf": 4,
                                       "yolov3": 2}, "any"),
    "heldout-large": (120, "poisson", {"bert": 3, "cifar10": 1, "deepspeech2": 2, "imagenet": 2, "ncf": 1,
                                       "yolov3": 2}, "high"),
    "heldout-small": (240, "poisson", {"bert": 1, "cifar10": 5, "deepspeech2": 2, "imagenet": 1, "ncf": 5,
                                       "yolov3": 1}, "low"),
}
# GPU counts users plausibly ask for per application (its size class: imagenet jobs are large).
APP_REQUESTS = {"cifar10": (1, 2, 4, 8), "ncf": (1, 2, 4), "bert": (2, 4, 8, 12, 16), "deepspeech2": (2, 4, 6, 8, 12),
                "yolov3": (2, 4, 8), "imagenet": (8, 12, 16, 24, 32)}


def heldout_rows(name: str, seed: int) -> list[dict]:
    """A Pollux-format workload (name,time,application,num_replicas,batch_size) from HELDOUT[name]:
    arrivals over 8 hours as a Poisson process, a diurnal one (rate 1 + 0.8 sin, three cycles),
    or bursts (4-12 jobs within 2 minutes at uniform instants); applications by weight; GPUs
    uniformly from the application's plausible counts (APP_REQUESTS: the lower half, all, or the
    upper half); batch from the application's Pollux batch sizes. Seeded by (name, seed) through
    a string seed, so a seed gives the same file on every machine."""
    jobs, process, weights, sizes = HELDOUT[name]
    rng = random.Random(f"{name}/{seed}")
    span = 8 * 3600.0
    times: list[float] = []
    if process == "bursty":
        while len(times) < jobs:
            t = rng.uniform(0, span)
            times += [t + rng.uniform(0, 120) for _ in range(rng.randint(4, 12))]
    elif process == "diurnal":
        while len(times) < jobs:   # thinning: accept t with probability (1 + 0.8 sin) / 1.8
            t = rng.uniform(0, span)
            if rng.random() < (1 + 0.8 * math.sin(2 * math.pi * 3 * t / span)) / 1.8:
                times.append(t)
    else:
        times = [rng.uniform(0, span) for _ in range(jobs)]
    times = sorted(times[:jobs])
    apps, w = zip(*sorted(weights.items()), strict=True)
    rows = []
    for i, t in enumerate(times):
        app = rng.choices(apps, w)[0]
        counts = APP_REQUESTS[app]
        half = (len(counts) + 1) // 2
        counts = counts[:half] if sizes == "low" else counts[-half:] if sizes == "high" else counts
        rows.append({"name": f"{name}-{i}", "time": round(t), "application": app, "num_replicas": rng.choice(counts),
                     "batch_size": rng.choice(APP_BATCHES[app])})
    return rows


def write_csv(path: Path, rows: list[dict]) -> Path:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def philly_windows(folder: Path, count: int, size: int) -> list[Path]:
    """`count` windows of `size` consecutive jobs (by submit time) of the real Philly trace, evenly
    spaced through it, as Philly-format CSVs (jobs asking for more than 64 GPUs dropped)."""
    with PHILLY.open(newline="") as f:
        rows = [r for r in csv.DictReader(f) if 1 <= int(r["num_gpus"]) <= 64 and float(r["duration"]) > 0]
    rows.sort(key=lambda r: r["timestamp"])
    step = len(rows) // (count + 1)
    return [write_csv(folder / f"philly-window-{i}.csv", rows[(i + 1) * step: (i + 1) * step + size])
            for i in range(count)]
