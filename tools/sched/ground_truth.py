"""The simulator's hidden truth about jobs, and the noisy signals a scheduler gets from it.

- Loss curves: every job trains along `loss(k) = 1 / (b0 k + b1) + b2` over samples k (the form
  Optimus fits, EuroSys'18) and stops when the loss reaches its `target_loss` (public: the user
  says when to stop); b0 is set so that this happens exactly at the job's true work. Reports
  carry 1% multiplicative noise.
- Throughput measurements: a running job's samples/s as measured, the true rate times
  (1 + N(0, rate_noise)), drawn once per start.
- `ModelWithError`: the throughput model a policy gets, the truth times a seeded log-normal
  factor per application (systematic) and per (application, shape, batch) (per point), scaled so
  the mean absolute relative error is about `error` (e.g. 0.1 = 10%).
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass
from functools import lru_cache
from statistics import NormalDist

from mlsyskit.core.sim import sub_seed
from mlsyskit.tools.sched.profiles import Shape
from mlsyskit.tools.sched.state import JobSpec
from mlsyskit.tools.sched.throughput import ThroughputModel

LOSS_NOISE = 0.01
_NORMAL = NormalDist()


@dataclass(frozen=True)
class LossCurve:
    b0: float
    b1: float
    b2: float
    target: float

    def at(self, samples: float) -> float:
        return 1.0 / (self.b0 * samples + self.b1) + self.b2


def loss_curve(seed: int, job: JobSpec) -> LossCurve:
    rng = random.Random(sub_seed(seed, f"loss/{job.name}"))
    b1, b2 = rng.uniform(0.5, 2.0), rng.uniform(0.05, 0.5)
    gap = rng.uniform(0.01, 0.05) / b1          # converged when within this of the asymptote
    b0 = (1.0 / gap - b1) / job.work
    return LossCurve(b0, b1, b2, b2 + gap)


def _gauss(seed: int, key: str) -> float:
    """A standard normal draw keyed by (seed, key): a hash, not an RNG object (cheap per call)."""
    return _NORMAL.inv_cdf((sub_seed(seed, key) + 0.5) / 2.0 ** 63)


def noisy_loss(seed: int, job: JobSpec, curve: LossCurve, samples: float, report: int) -> float:
    return curve.at(samples) * (1.0 + LOSS_NOISE * _gauss(seed, f"loss-report/{job.name}/{report}"))


def measured_rate(seed: int, job: JobSpec, start: int, true_rate: float, noise: float) -> float:
    if noise == 0:
        return true_rate
    return true_rate * max(0.5, 1.0 + noise * _gauss(seed, f"rate/{job.name}/{start}"))


class ModelWithError:
    """A fitted model as a policy would have it: `truth` off by about `error` (mean |relative|)."""

    def __init__(self, truth: ThroughputModel, error: float, seed: int = 0) -> None:
        if not 0.0 <= error < 1.0 or not math.isfinite(error):
            raise ValueError(f"model error must be in [0, 1), got {error}")
        self.truth, self.error, self.seed = truth, error, seed
        # E|exp(s z) - 1| ~ s * sqrt(2 / pi) for small s; split the variance between app and point.
        self._sigma = error / math.sqrt(2.0 / math.pi) / math.sqrt(2.0)
        self.profiles = truth.profiles
        self.rate = lru_cache(maxsize=None)(self._rate)

    @property
    def apps(self) -> list[str]:
        return self.truth.apps

    def check_app(self, app: str) -> None:
        self.truth.check_app(app)

    def _factor(self, key: str) -> float:
        return math.exp(self._sigma * random.Random(sub_seed(self.seed, f"model-error/{key}")).gauss(0.0, 1.0))

    def _rate(self, app: str, shape: Shape, global_batch: int) -> float:
        true = self.truth.rate(app, shape, global_batch)
        if self.error == 0.0:
            return true
        return true * self._factor(app) * self._factor(f"{app}/{shape}/{global_batch}")

    def efficiency(self, app: str, shape: Shape, global_batch: int) -> float:
        return self.rate(app, shape, global_batch) / (sum(shape) * self.rate(app, (1,), global_batch))
