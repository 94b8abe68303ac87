"""What a scheduler knows about throughput: an offline prior, corrected online by measurements.

- `PriorModel`: each application's Pollux-form fit (`scaling_model.FittedModel`: per-GPU compute
  linear in the local batch, all-reduce time linear in the GPU count, within a node or across
  nodes), as a scheduler fits it once on profiles measured elsewhere, times a seeded error that
  is smooth in the placement, as a fitted model's is: log-normal per application (level), per
  application times log2 of the GPU count (a wrong scaling slope) and per application on more
  than one node (a wrong network), scaled so its mean |relative error| is about `error`
  (`DEFAULT_MODEL_ERROR`, 10%, on top of the form's own misfit). It holds the six fitted numbers
  and the largest local batch per application, never the measurements nor the simulator's model.
- `LearnedModel`: the prior, corrected by the throughput samples the cluster reports (`samples`:
  (application, shape, global batch, samples/s measured with noise), appended by the simulator or
  daemon whenever a job starts or is resized on a shape). A shape gets the prior times the
  geometric mean of measured/prior over the samples with its GPU and node count; an unmeasured
  count the same over the counts measured for that (application, batch) (per job kind; nearer
  GPU counts and the same single/multi-node side weigh more), else over every batch of the
  application (its history), else the prior alone. Estimates are refreshed when a (application,
  batch, GPUs, nodes) gets its 1st, 4th, 16th, 64th, ... sample, so they converge while a
  policy's memo tables stay valid between refreshes (`versions[(app, batch)]` and `version`
  count them; a batch without measurements of its own follows its application's).
"""
from __future__ import annotations

import math
import random
from functools import lru_cache

from mlsyskit.core.sim import sub_seed
from mlsyskit.tools.sched.profiles import Shape
from mlsyskit.tools.sched.scaling_model import FittedModel

# The documented default error of the prior (mean |relative| error over shapes and batches): a
# profile measured on another cluster or software stack is typically 5-20% off.
DEFAULT_MODEL_ERROR = 0.1

Sample = tuple[str, Shape, int, float]   # (application, shape, global batch, measured samples/s)


class PriorModel:
    """Throughput from each application's fitted scaling model, off by about `error`."""

    def __init__(self, fits: dict[str, FittedModel], max_local: dict[str, float], error: float = DEFAULT_MODEL_ERROR,
                 seed: int = 0) -> None:
        if not (math.isfinite(error) and 0.0 <= error < 1.0):
            raise ValueError(f"model error must be in [0, 1), got {error}")
        self.fits, self.max_local, self.error, self.seed = dict(fits), dict(max_local), error, seed
        # E|exp(s z) - 1| ~ s * sqrt(2 / pi) for small s; the variance split between level, slope
        # (over 1..64 GPUs: log2 K / 6 in [0, 1]) and network terms.
        self._sigma = error / math.sqrt(2.0 / math.pi) / math.sqrt(2.0)
        self.rate = lru_cache(maxsize=None)(self._rate)

    @classmethod
    def of(cls, model, error: float = DEFAULT_MODEL_ERROR, seed: int = 0) -> PriorModel:
        """The fitted parameters of a ThroughputModel's applications (nothing else is kept)."""
        return cls({a: model.fits[a] for a in model.apps},
                   {a: model.profiles[a].max_local_bsz for a in model.apps}, error, seed)

    @property
    def apps(self) -> list[str]:
        return sorted(self.fits)

    def _draws(self, app: str) -> tuple[float, float, float]:
        rng = random.Random(sub_seed(self.seed, f"model-error/{app}"))
        return rng.gauss(0.0, 1.0), rng.gauss(0.0, 1.0), rng.gauss(0.0, 1.0)

    def _factor(self, app: str, shape: Shape) -> float:
        if self.error == 0.0:
            return 1.0
        level, slope, network = self._draws(app)
        z = level + slope * math.log2(sum(shape)) / 6.0 + (network if len(shape) > 1 else 0.0) / 2.0
        return math.exp(self._sigma * z)

    def _rate(self, app: str, shape: Shape, global_batch: int) -> float:
        if not shape:
            return 0.0
        fit, gpus = self.fits[app], sum(shape)
        local = global_batch / gpus
        accum = max(1, math.ceil(local / self.max_local[app] - 1e-9))
        seconds = fit.sync_time(gpus, len(shape)) + accum * fit.compute_time(local / accum)
        return global_batch / seconds * self._factor(app, shape)


class LearnedModel:
    """The prior corrected by measured samples (module docstring); `rate` as a ThroughputModel's."""

    def __init__(self, prior: PriorModel, samples: list[Sample] | None = None) -> None:
        self.prior = prior
        self.samples: list[Sample] = samples if samples is not None else []
        self.version = 0
        self.versions: dict[tuple[str, int], int] = {}   # (app, batch) -> refreshes that changed its estimates
        self._seen = 0
        # per (app, batch, GPUs, nodes): sum and count of log(measured / prior)
        self._sums: dict[tuple[str, int, int, int], list[float]] = {}
        self._measured: dict[tuple[str, int], dict[tuple[int, int], float]] = {}   # snapshot of mean log ratios
        self._cache: dict[tuple[str, int], dict[Shape, float]] = {}
        self._batches: dict[str, set[int]] = {}   # batches asked about per application
        self._factors: dict[str, dict[tuple, float | None]] = {}   # _estimate's corrections per app

    @property
    def apps(self) -> list[str]:
        return self.prior.apps

    @property
    def pending(self) -> bool:
        """Samples reported that the next `rate` takes in first (moving its estimates)."""
        return self._seen != len(self.samples)

    def refresh(self) -> None:
        """Take in the samples reported since the last call."""
        if self._seen == len(self.samples):
            return
        changed = set()
        for app, shape, batch, rate in self.samples[self._seen:]:
            if rate <= 0 or not math.isfinite(rate) or not shape:
                continue
            where = (sum(shape), len(shape))
            acc = self._sums.setdefault((app, batch, *where), [0.0, 0])
            acc[0] += math.log(rate / self.prior.rate(app, shape, batch))
            acc[1] += 1
            if acc[1] & (acc[1] - 1) == 0 and acc[1].bit_length() % 2 == 1:   # a power of 4: refresh
                self._measured.setdefault((app, batch), {})[where] = acc[0] / acc[1]
                changed.add((app, batch))
        self._seen = len(self.samples)
        stale = set(changed)
        for app, _ in changed:   # batches without measurements of their own follow the application's
            stale.update((app, b) for b in self._batches.get(app, ()) if (app, b) not in self._measured)
        for key in stale:
            self._cache.pop(key, None)
            self.versions[key] = self.versions.get(key, 0) + 1
        if changed:
            self.version += 1
        for app, _ in changed:
            self._factors.pop(app, None)

    def rate(self, app: str, shape: Shape, global_batch: int) -> float:
        if self._seen != len(self.samples):
            self.refresh()
        per_kind = self._cache.get((app, global_batch))
        if per_kind is None:
            per_kind = self._cache[(app, global_batch)] = {}
            self._batches.setdefault(app, set()).add(global_batch)
        value = per_kind.get(shape)
        if value is None:
            value = per_kind[shape] = self._estimate(app, shape, global_batch)
        return value

    def _estimate(self, app: str, shape: Shape, batch: int) -> float:
        """The prior times exp(the mean log measured/prior ratio) at the same GPU and node count,
        else weighted over the measured counts of this batch, else of the application."""
        if not shape:
            return 0.0
        prior = self.prior.rate(app, shape, batch)
        where = (sum(shape), len(shape))
        same = self._measured.get((app, batch), {})
        if where in same:
            return prior * math.exp(same[where])
        # the weighted correction depends on the batch only through whose points it averages (its
        # own, else the application's): kept per (app, own batch or None, GPUs, nodes) until a
        # refresh changes that application's points, the same sum in the same order
        factors = self._factors.get(app)
        if factors is None:
            factors = self._factors[app] = {}
        key = (batch if same else None, *where)
        factor = factors.get(key, False)
        if factor is False:
            factor = factors[key] = self._correction(app, same, where)
        return prior * factor if factor is not None else prior

    def _correction(self, app: str, same: dict, where: tuple[int, int]) -> float | None:
        points = list(same.items())
        if not points:   # the application's other batch sizes
            points = [p for (a, _), per in self._measured.items() if a == app for p in per.items()]
        if not points:
            return None
        num = den = 0.0
        for (gpus, nodes), log_ratio in points:
            w = 1.0 / (1.0 + abs(math.log2(where[0] / gpus)) + (nodes != where[1])) ** 2
            num += w * log_ratio
            den += w
        return math.exp(num / den)
