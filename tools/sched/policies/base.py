"""The policy interface, its options, and the registry that maps CLI names to classes.

A policy is created with a throughput model (the scheduler's fitted model, with its error; never
the simulator's truth) and options, and answers `decide(state) -> Decision`:

- `state` (state.ClusterState, owned by the caller, read-only for the policy): `spec` (nodes x
  GPUs), `free` (FreeMap), `now`, `queue` and `running` (job id -> JobView, in (re)entry order),
  `by_end` ((estimated end, job id) of running jobs, earliest first), `restart_cost` and
  `history` (sizes of finished jobs per application, for run-time estimates).
- a `JobView` is what a scheduler observes of a job: the request (app, gpus asked, global
  batch, arrival, target loss), placement and shape, first start, restarts, `attained_at(now)`
  (GPU-seconds), `progress_at(now)` (samples reported), `measured_rate` (samples/s measured
  with noise on the current shape), `loss_reports` ((samples, loss) pairs), `batch` (the global
  batch it runs with) and `noise_scale` (its gradient noise scale as last measured). It has no
  true work, rate or noise scale.
- the Decision lists `Start(job, placement, shape[, batch])`, `Preempt(job)`, `Resize(job,
  placement, shape[, batch])`, `Rebatch(job, batch)` (a running job's batch in place, no
  restart; the daemon ignores it) and an optional `wake_at`; the caller applies all releases
  before all starts.

A policy may keep memo tables and its own event bookkeeping (optimus remembers when it last
re-planned, tiresias keeps a priority index); the simulator and the scheduler daemon call it the
same way, once per decision, with the same kind of state. A policy that reads loss reports
defines `wants_loss_reports(now) -> bool`; the caller refreshes the reports of running jobs
before a decision for which it answers True. A policy with `wants_noise_scale = True` gets each
job's measured noise scale at every start and every GNS_REPORT_S of running (`state.noise_reports`
journals which jobs reported).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

from mlsyskit.core.config import require
from mlsyskit.core.registry import Registry
from mlsyskit.tools.sched.state import ClusterState, Decision
from mlsyskit.tools.sched.throughput import ThroughputModel


@dataclass(frozen=True)
class PolicyOptions:
    efficiency_threshold: float = 0.5     # marble-fifo, marble-las: least marginal gain of one more GPU (single-GPU units)
    pressure_threshold: float = 0.8       # marble: the same while waiting jobs' sizes exceed the free GPUs
    backfill_depth: int = 500             # jobs examined per decision behind a blocked head (Slurm's bf_max_job_test)
    tiresias_thresholds: tuple[float, ...] = (3600.0, 36000.0)  # GPU-seconds between LAS queues
    optimus_interval: float = 600.0       # seconds between Optimus' full re-allocations
    grow_min_gain: float = 1.0            # marble-elastic: grow only if it saves this many restart costs
    # marble-las: its own pressure threshold, chosen by leave-one-family-out cross-validation in
    # scripts/bench_marble.py (0.5 = pressure sizing off won on every held-out family).
    las_pressure_threshold: float = 0.5
    # marble (scripts/bench_marble.py --tune chose these on the four shipped Pollux workloads only):
    admit_threshold: float = 0.7          # marble's p*: least marginal gain of a GPU within the request
    grow_threshold: float = 0.3           # least marginal gain of a GPU beyond a job's p*, in single-GPU units
    elastic_max_scale: float = 4.0        # a job gets at most this many times the GPUs it asked for
    resize_interval: float = 1800.0       # seconds between two growths of one running job (bounded restarts)
    grow_period: float = 300.0            # seconds between passes that grow running jobs onto idle GPUs
    starvation_s: float = 24 * 3600.0     # a job waiting this long goes ahead of every other (starvation guard)
    rank_by_estimate: bool = True         # inside a LAS queue, least estimated remaining time on one GPU first (else FIFO)
    # marble's own attained-service queues (GPU-seconds; tiresias keeps tiresias_thresholds):
    # () = one queue, ordered by the estimate alone (shortest estimated remaining time first)
    marble_thresholds: tuple[float, ...] = (3600.0, 36000.0)
    marble_grow_gain: float = 4.0         # marble: grow a running job only if it saves this many restart costs
    # marble: pick each job's global batch with its GPU count for goodput (Pollux); off = the submitted batch
    adapt_batch: bool = True
    goodput_sizing: bool = True           # marble: GPU counts from the goodput curve (else throughput at the submitted batch)

    def __post_init__(self) -> None:
        require(0.0 <= self.efficiency_threshold <= 1.5, "efficiency_threshold must be in [0, 1.5]")
        require(0.0 <= self.pressure_threshold <= 1.5, "pressure_threshold must be in [0, 1.5]")
        require(self.backfill_depth >= 1, "backfill_depth must be >= 1")
        for name in ("tiresias_thresholds", "marble_thresholds"):
            values = getattr(self, name)
            require(list(values) == sorted(values) and all(t > 0 for t in values), f"{name} must be positive and rising")
        require(self.optimus_interval > 0, "optimus_interval must be > 0")
        require(self.grow_min_gain >= 0 and self.marble_grow_gain >= 0, "grow_min_gain, marble_grow_gain must be >= 0")
        require(0.0 <= self.las_pressure_threshold <= 1.5, "las_pressure_threshold must be in [0, 1.5]")
        require(0.0 < self.grow_threshold <= 1.5, "grow_threshold must be in (0, 1.5]")
        require(0.0 <= self.admit_threshold <= 1.5, "admit_threshold must be in [0, 1.5]")
        require(1.0 <= self.elastic_max_scale <= 64.0, "elastic_max_scale must be in [1, 64]")
        require(self.resize_interval >= 0 and self.grow_period > 0, "resize_interval must be >= 0, grow_period > 0")
        require(self.starvation_s > 0, "starvation_s must be > 0")


class Policy(ABC):
    name: ClassVar[str]
    description: ClassVar[str]

    def __init__(self, model: ThroughputModel, options: PolicyOptions | None = None) -> None:
        self.model = model
        self.options = options or PolicyOptions()

    @abstractmethod
    def decide(self, state: ClusterState) -> Decision:
        """Actions to take now. Must not mutate `state`."""


POLICIES: Registry[Policy] = Registry("policy")
register = POLICIES.add


def create_policy(name: str, model: ThroughputModel, options: PolicyOptions | None = None) -> Policy:
    return POLICIES.get(name)(model, options)
