"""Measured step times of DL applications per placement, from the Pollux artifact.

A placement is the number of GPUs used on each node; marble keys it as a "shape": the per-node
counts sorted in descending order, so "1212" and "2211" (same GPUs, other node order) share one key.
`placements.csv` gives exact placements on 4-GPU nodes; `scalability.csv` gives larger spread
runs by (num_nodes, num_replicas). Both carry step_time (compute + gradient sync) and sync_time.
"""
from __future__ import annotations

import csv
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

DATA_DIR = Path(__file__).resolve().parent / "data"
APPS_DIR = DATA_DIR / "pollux-apps"

Shape = tuple[int, ...]


def canonical(shape: tuple[int, ...] | list[int]) -> Shape:
    """Per-node GPU counts, zeros dropped, largest first."""
    return tuple(sorted((int(g) for g in shape if g > 0), reverse=True))


def shape_from_placement(placement: str) -> Shape:
    return canonical([int(c) for c in placement])


@dataclass(frozen=True)
class Row:
    """One measurement: a placement run with a local batch size."""

    shape: Shape | None  # None for scalability.csv rows (only node/replica counts known)
    num_nodes: int
    num_replicas: int
    local_bsz: float
    step_time: float
    sync_time: float


class Curve:
    """step_time and sync_time against local batch size for one configuration, linear in between."""

    def __init__(self, rows: list[Row]) -> None:
        by_bsz: dict[float, list[Row]] = defaultdict(list)
        for r in rows:
            by_bsz[r.local_bsz].append(r)
        bsz = sorted(by_bsz)
        self.bsz = np.array(bsz, dtype=float)
        self.step = np.array([np.mean([r.step_time for r in by_bsz[b]]) for b in bsz])
        self.sync = np.array([np.mean([r.sync_time for r in by_bsz[b]]) for b in bsz])

    def at(self, local_bsz: float) -> tuple[float, float]:
        """(step_time, sync_time), clamped to the measured batch range (no extrapolation here)."""
        return float(np.interp(local_bsz, self.bsz, self.step)), float(np.interp(local_bsz, self.bsz, self.sync))


class AppProfile:
    """All measurements of one application."""

    def __init__(self, name: str, rows: list[Row]) -> None:
        if not rows:
            raise ValueError(f"application {name!r} has no measurements")
        self.name = name
        self.rows = rows
        self.max_local_bsz = max(r.local_bsz for r in rows if r.num_replicas == 1) if any(
            r.num_replicas == 1 for r in rows) else max(r.local_bsz for r in rows)
        by_shape: dict[Shape, list[Row]] = defaultdict(list)
        by_count: dict[tuple[int, int], list[Row]] = defaultdict(list)
        for r in rows:
            if r.shape is not None:
                by_shape[r.shape].append(r)
            else:
                by_count[(r.num_nodes, r.num_replicas)].append(r)
        self.shapes: dict[Shape, Curve] = {s: Curve(rs) for s, rs in by_shape.items()}
        self.spread: dict[tuple[int, int], Curve] = {k: Curve(rs) for k, rs in by_count.items()}
        self.max_gpus_per_node = max(max(s) for s in self.shapes)

    def nearest_measured(self, shape: Shape) -> tuple[Shape | tuple[int, int], Curve]:
        """The measured configuration closest to `shape`: the same shape with per-node counts capped at
        what the testbed had if that was measured, else the measured shape or spread run with the
        nearest node and GPU counts (log distance)."""
        capped = canonical([min(g, self.max_gpus_per_node) for g in shape])
        if capped in self.shapes:
            return capped, self.shapes[capped]
        nodes, gpus = len(capped), sum(capped)

        def distance(key: tuple[int, int]) -> float:
            return abs(np.log(key[0] / nodes)) + abs(np.log(key[1] / gpus))

        best_spread = min(self.spread, key=lambda k: (distance(k), k)) if self.spread else None
        best_shape = min(self.shapes, key=lambda s: (distance((len(s), sum(s))), s))
        if best_spread is not None and distance(best_spread) < distance((len(best_shape), sum(best_shape))):
            return best_spread, self.spread[best_spread]
        return best_shape, self.shapes[best_shape]


def load_profile(app_dir: Path) -> AppProfile:
    rows: list[Row] = []
    with (app_dir / "placements.csv").open(newline="") as f:
        for rec in csv.DictReader(f):
            shape = shape_from_placement(rec["placement"])
            rows.append(Row(shape, len(shape), sum(shape), float(rec["local_bsz"]), float(rec["step_time"]),
                            float(rec["sync_time"])))
    scal = app_dir / "scalability.csv"
    if scal.exists():
        with scal.open(newline="") as f:
            for rec in csv.DictReader(f):
                rows.append(Row(None, int(rec["num_nodes"]), int(rec["num_replicas"]), float(rec["local_bsz"]),
                                float(rec["step_time"]), float(rec["sync_time"])))
    return AppProfile(app_dir.name, rows)


LINEAR_APP = "linear"


def linear_profile() -> AppProfile:
    """An application that scales perfectly (no gradient sync, step time proportional to the local
    batch): what the daemon sizes a job by when it names no application. Such a job runs on exactly
    the GPUs it asks for, so the profile only has to rank and place it, never to resize it."""
    shapes = ((1,), (2,), (4,), (1, 1), (2, 2), (4, 4))
    return AppProfile(LINEAR_APP, [Row(s, len(s), sum(s), bsz, 0.1 * bsz, 0.0) for s in shapes for bsz in (1.0, 2.0)])


def load_profiles(root: Path = APPS_DIR) -> dict[str, AppProfile]:
    if not root.is_dir():
        raise FileNotFoundError(f"marble's measurement folder {root} is missing; install from a source "
                                "checkout (scripts/setup) so tools/sched/data/ is present")
    apps = {d.name: load_profile(d) for d in sorted(root.iterdir()) if (d / "placements.csv").exists()}
    if not apps:
        raise FileNotFoundError(f"no application profiles under {root}")
    return apps
