"""The simulator's hidden truth about jobs, and the noisy signals a scheduler gets from it.

- Loss curves: every job trains along a power law with a floor, `loss(k) = b2 + a / (1 + k / k0)^alpha`
  over samples k, alpha drawn in [0.3, 0.8] per job: not the family Optimus fits
  (`1 / (b0 k + b1) + b2`, i.e. alpha = 1), so its loss-curve fit extrapolates with a realistic
  error. The job stops when the loss reaches its `target_loss` (public: the user says when to
  stop); k0 is set so that this happens exactly at the job's true work. Reports carry 1%
  multiplicative noise.
- Throughput measurements: a running job's samples/s as measured, the true rate times
  (1 + N(0, rate_noise)), drawn once per start.
- Gradient noise scale phi (efficiency.py: a batch M progresses (phi + B0) / (phi + M) as far
  per sample as the submitted batch B0): each job's follows its application's trajectory over
  its progress fraction f (log-linear between KNOTS), times a per-job log-normal factor, held
  constant over SEGMENTS equal slices of f so progress stays piecewise linear in time. The knots
  are read off the Pollux artifact's validation traces (petuum/adaptdl osdi21-artifact,
  simulator/traces/<app>/validation-<M0>.csv, Apache-2.0): phi = M0 * grad_var / grad_sqr at the
  epochs nearest f. Measured at each start and whenever the job enters its next slice of work
  (efficiency.py), the hidden value times a log-normal error (MEASURE_NOISE).

The throughput model a policy gets is never the simulator's (policies.learned: a prior fitted
offline, with error, corrected by these measurements).
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass
from functools import cache
from statistics import NormalDist

from mlsyskit.core.sim import sub_seed
from mlsyskit.tools.sched.state import JobSpec

LOSS_NOISE = 0.01

# (progress fraction, phi in samples) per application, from the validation traces (module docstring)
KNOTS = {
    "imagenet": ((0.0, 930.0), (0.25, 5_900.0), (0.5, 11_400.0), (0.75, 14_400.0), (1.0, 14_400.0)),
    "cifar10": ((0.0, 205.0), (0.25, 6_700.0), (0.5, 15_600.0), (0.75, 45_300.0), (1.0, 73_400.0)),
    "deepspeech2": ((0.0, 111.0), (0.06, 2_340.0), (0.125, 7_500.0), (0.25, 54_500.0), (0.5, 130_000.0),
                    (1.0, 396_000.0)),
    "yolov3": ((0.0, 120.0), (0.25, 331.0), (0.5, 460.0), (0.75, 987.0), (1.0, 5_100.0)),
    "ncf": ((0.0, 18_600.0), (0.1, 7_700_000.0), (1.0, 59_000_000.0)),
    "bert": ((0.0, 423.0), (1.0, 1_124.0)),
}
SEGMENTS = 8
JOB_SPREAD = 0.4           # sigma of the per-job log factor on phi (jobs of one application differ)
MEASURE_NOISE = 0.25       # sigma of the log error of one measured phi (gradient statistics are noisy)
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


def measured_noise_scale(seed: int, job: JobSpec, report: str, true_phi: float) -> float:
    """A gradient noise scale the job reports (`report` names which): the truth times a log-normal error."""
    return true_phi * math.exp(MEASURE_NOISE * _gauss(seed, f"gns-report/{job.name}/{report}"))


def measured_rate(seed: int, job: JobSpec, start: int, true_rate: float, noise: float) -> float:
    if noise == 0:
        return true_rate
    return true_rate * max(0.5, 1.0 + noise * _gauss(seed, f"rate/{job.name}/{start}"))


def app_phi(app: str, f: float) -> float:
    """The application's phi at progress fraction f (log-linear between knots)."""
    knots = KNOTS[app]
    for (f0, p0), (f1, p1) in zip(knots, knots[1:], strict=False):
        if f <= f1:
            t = (min(max(f, f0), f1) - f0) / (f1 - f0)
            return p0 * (p1 / p0) ** t
    return knots[-1][1]


def noise_scale_segments(seed: int, name: str, app: str) -> tuple[float, ...]:
    """A job's hidden phi per slice of its progress (truth; the simulator's only); () for an
    application without a trajectory (its batch never changes)."""
    if app not in KNOTS:
        return ()
    factor = math.exp(JOB_SPREAD * _gauss(seed, f"gns/{name}"))
    return tuple(factor * p for p in _app_segments(app))


@cache
def _app_segments(app: str) -> tuple[float, ...]:
    return tuple(app_phi(app, (k + 0.5) / SEGMENTS) for k in range(SEGMENTS))
