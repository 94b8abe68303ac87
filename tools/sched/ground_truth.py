"""The simulator's hidden truth about jobs, and the noisy signals a scheduler gets from it.

- Loss curves: every job trains along a power law with a floor, `loss(k) = b2 + a / (1 + k / k0)^alpha`
  over samples k, alpha drawn in [0.3, 0.8] per job: not the family Optimus fits
  (`1 / (b0 k + b1) + b2`, i.e. alpha = 1), so its loss-curve fit extrapolates with a realistic
  error. The job stops when the loss reaches its `target_loss` (public: the user says when to
  stop); k0 is set so that this happens exactly at the job's true work. Reports carry 1%
  multiplicative noise.
- Throughput measurements: a running job's samples/s as measured, the true rate times
  (1 + N(0, rate_noise)), drawn once per start.

The throughput model a policy gets is never the simulator's (policies.learned: a prior fitted
offline, with error, corrected by these measurements).
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from statistics import NormalDist

from mlsyskit.core.sim import sub_seed
from mlsyskit.tools.sched.state import JobSpec

LOSS_NOISE = 0.01
_NORMAL = NormalDist()


@dataclass(frozen=True)
class LossCurve:
    a: float
    k0: float
    alpha: float
    b2: float
    target: float

    def at(self, samples: float) -> float:
        return self.b2 + self.a / (1.0 + samples / self.k0) ** self.alpha


def loss_curve(seed: int, job: JobSpec) -> LossCurve:
    rng = random.Random(sub_seed(seed, f"loss/{job.name}"))
    a, b2, alpha = rng.uniform(0.5, 2.0), rng.uniform(0.05, 0.5), rng.uniform(0.3, 0.8)
    gap = a * rng.uniform(0.02, 0.1)            # converged when within this of the floor
    k0 = job.work / ((a / gap) ** (1.0 / alpha) - 1.0)
    return LossCurve(a, k0, alpha, b2, b2 + gap)


def _gauss(seed: int, key: str) -> float:
    """A standard normal draw keyed by (seed, key): a hash, not an RNG object (cheap per call)."""
    return _NORMAL.inv_cdf((sub_seed(seed, key) + 0.5) / 2.0 ** 63)


def noisy_loss(seed: int, job: JobSpec, curve: LossCurve, samples: float, report: int) -> float:
    return curve.at(samples) * (1.0 + LOSS_NOISE * _gauss(seed, f"loss-report/{job.name}/{report}"))


def measured_rate(seed: int, job: JobSpec, start: int, true_rate: float, noise: float) -> float:
    if noise == 0:
        return true_rate
    return true_rate * max(0.5, 1.0 + noise * _gauss(seed, f"rate/{job.name}/{start}"))
