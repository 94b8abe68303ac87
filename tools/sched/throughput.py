"""Job throughput (samples/s) for a placement and the efficiency curve (marble's size rule,
which reads them, is `policies.marble.sized_shapes`).

Lookup order for a placement shape at local batch m:
1. a measured shape: interpolate between measured local batch sizes (clamped to their range);
2. otherwise (extrapolated) the fitted model, scaled by measured/model at the nearest measured
   configuration (same shape with per-node counts capped at the testbed's 4 GPUs, or the nearest
   spread run), so unmeasured 5- and 6-GPU nodes inherit the model's slope but keep the measured
   level; then made monotone: an extrapolated shape s of K GPUs is compared with its predecessor
   p(s) (one GPU fewer on its smallest node; p(compact(K)) = compact(K - 1)) and its throughput
   clamped to [T(p), T(p) K / (K - 1)], so adding a GPU never loses throughput and never raises
   efficiency T / K. Switching anchors made the raw estimate jump (imagenet at batch 3200 on
   6-GPU nodes: 4,497 samples/s on 25 GPUs, 4,069 on 26).

A job keeps its global batch B. With K GPUs the local batch is B/K; above the largest batch one
GPU was measured with, the job accumulates gradients over k micro-steps (as Pollux does):
    time per step = sync + k * (step(m) - sync(m)),   m = B / (K k)
"""
from __future__ import annotations

import math
from functools import cache, lru_cache

from mlsyskit.tools.sched.profiles import AppProfile, Shape, load_profiles
from mlsyskit.tools.sched.scaling_model import FittedModel, fit


@cache   # asked for in every sizing loop of every decision; a few hundred distinct answers
def compact_shape(gpus: int, gpus_per_node: int) -> Shape:
    """`gpus` GPUs on as few nodes as possible: full nodes, then the remainder."""
    full, rest = divmod(gpus, gpus_per_node)
    return (gpus_per_node,) * full + ((rest,) if rest else ())


def predecessor(shape: Shape) -> Shape:
    """`shape` with one GPU fewer on its smallest node (the node dropped when it empties)."""
    *rest, last = shape
    return tuple(rest) + ((last - 1,) if last > 1 else ())


class ThroughputModel:
    """Deterministic, cached throughput of every (application, shape, global batch)."""

    def __init__(self, profiles: dict[str, AppProfile] | None = None) -> None:
        self.profiles = profiles if profiles is not None else load_profiles()
        self.fits: dict[str, FittedModel] = {name: fit(p.rows) for name, p in self.profiles.items()}
        self.rate = lru_cache(maxsize=None)(self._rate)
        self._raw = lru_cache(maxsize=None)(self._raw_rate)

    @property
    def apps(self) -> list[str]:
        return sorted(self.profiles)

    def check_app(self, app: str) -> None:
        if app not in self.profiles:
            raise KeyError(f"unknown application {app!r}; known: {', '.join(self.apps)}")

    def step_and_sync(self, app: str, shape: Shape, local_bsz: float) -> tuple[float, float]:
        profile, model = self.profiles[app], self.fits[app]
        if shape in profile.shapes:
            return profile.shapes[shape].at(local_bsz)
        key, curve = profile.nearest_measured(shape)
        meas_step, meas_sync = curve.at(local_bsz)
        anchor_nodes, anchor_gpus = (len(key), sum(key)) if key in profile.shapes else key
        scale = meas_step / model.step_time(anchor_gpus, anchor_nodes, local_bsz)
        step = scale * model.step_time(sum(shape), len(shape), local_bsz)
        sync = min(step, scale * model.sync_time(sum(shape), len(shape)))
        return step, sync

    def is_measured(self, app: str, shape: Shape) -> bool:
        """True when the testbed ran this shape (the throughput is interpolated in batch size only)."""
        return shape in self.profiles[app].shapes

    def _rate(self, app: str, shape: Shape, global_batch: int) -> float:
        """Samples per second of a job with global batch `global_batch` on `shape`: measured, or
        extrapolated and clamped against its predecessor (module docstring)."""
        if not shape:
            return 0.0
        chain = [shape]
        while not self.is_measured(app, chain[-1]) and sum(chain[-1]) > 1:
            chain.append(predecessor(chain[-1]))
        rate = self._raw(app, chain[-1], global_batch)
        for s in reversed(chain[:-1]):   # upwards from the measured (or single-GPU) end
            k = sum(s)
            rate = min(max(self._raw(app, s, global_batch), rate), rate * k / (k - 1))
        return rate

    def _raw_rate(self, app: str, shape: Shape, global_batch: int) -> float:
        """The estimate before the monotone clamp."""
        gpus = sum(shape)
        local = global_batch / gpus
        max_local = self.profiles[app].max_local_bsz
        accum = max(1, math.ceil(local / max_local - 1e-9))
        local /= accum
        step, sync = self.step_and_sync(app, shape, local)
        seconds = sync + accum * max(step - sync, 1e-9)
        return global_batch / seconds

    def efficiency(self, app: str, shape: Shape, global_batch: int) -> float:
        """E(p) = T(p) / (p * T(1))."""
        return self.rate(app, shape, global_batch) / (sum(shape) * self.rate(app, (1,), global_batch))

    def efficiency_curve(self, app: str, global_batch: int, max_gpus: int, gpus_per_node: int) -> list[dict]:
        rows = []
        for p in range(1, max_gpus + 1):
            shape = compact_shape(p, gpus_per_node)
            rows.append({"gpus": p, "shape": "".join(map(str, shape)),
                         "throughput": self.rate(app, shape, global_batch),
                         "efficiency": self.efficiency(app, shape, global_batch),
                         "measured": self.is_measured(app, shape)})
        return rows
