"""What a policy sees and what it returns, kept apart from the simulator's ground truth.

A trace entry (`JobSpec`) carries the job's true work; only the simulator reads it. A policy sees
a `ClusterState` whose jobs are `JobView`s: what a real scheduler knows about a job (the request,
its placement, elapsed time, attained service, samples processed as the job reports them, its
throughput as measured with noise, its loss reports, its gradient noise scale as measured) and
never its true work, true rate or true noise scale. The
simulator (or the scheduler daemon) owns the state and updates it incrementally; a policy reads
it and returns actions. Policies must not mutate it.
"""
from __future__ import annotations

import math
from bisect import bisect_right, insort
from dataclasses import dataclass, field
from operator import itemgetter

from sortedcontainers import SortedList

from mlsyskit.tools.sched.cluster import ClusterSpec, FreeMap, Placement
from mlsyskit.tools.sched.profiles import Shape

gpus_of = itemgetter(1)   # a placement entry (node, GPUs) -> GPUs

# Without any history a job is expected to run this long (Slurm's DefaultTime plays this role).
DEFAULT_RUNTIME_S = 3600.0


@dataclass(frozen=True)
class JobSpec:
    """One job of a trace. `work` is ground truth: only the simulator reads it."""

    job_id: int
    name: str
    app: str
    arrival: float       # seconds
    gpus: int            # GPUs the user asked for
    batch_size: int      # global batch, kept fixed whatever the allocation
    work: float          # samples to process until the job is done


@dataclass
class JobRecord:
    """The simulator's true progress of one job (never handed to a policy)."""

    spec: JobSpec
    done: float = 0.0               # samples processed up to `since`
    attained: float = 0.0           # GPU-seconds held up to `since`
    since: float = 0.0
    placement: Placement = ()
    shape: Shape = ()
    rate: float = 0.0               # true samples/s on `shape`
    busy_until: float = 0.0         # checkpoint-restart in progress until then (no progress)
    first_start: float | None = None
    started_before: bool = False
    restarts: int = 0
    end: float = math.inf           # true end while running
    batch: int = 0                  # global batch it runs with (0: the submitted one)
    gains: tuple[float, ...] = ()   # per slice of its work: progress per sample at `batch` (efficiency.py)

    @property
    def held_gpus(self) -> int:
        return sum(map(gpus_of, self.placement))

    def done_at(self, now: float) -> float:
        """Progress in samples at the submitted batch (statistically efficient samples)."""
        if not self.placement:
            return self.done
        dt = max(0.0, now - max(self.since, self.busy_until))
        if not self.gains:   # the submitted batch: one sample counts one
            return self.done + self.rate * dt
        work, gains = self.spec.work, self.gains
        n = len(gains)
        p, k = self.done, min(int(self.done / work * n), n - 1)
        while k < n:
            edge = work * (k + 1) / n
            r = self.rate * gains[k]
            if p + r * dt <= edge or k == n - 1:
                return p + r * dt
            dt -= (edge - p) / r
            p, k = edge, k + 1
        return p

    def seconds_left(self) -> float:
        """Seconds of running (from `done`) until the work is done at the current batch."""
        left = max(0.0, self.spec.work - self.done)
        if not self.gains:
            return left / self.rate
        work, gains = self.spec.work, self.gains
        n = len(gains)
        p, k, t = self.done, min(int(self.done / work * n), n - 1), 0.0
        while k < n and p < work:
            edge = work if k == n - 1 else work * (k + 1) / n
            t += max(0.0, edge - p) / (self.rate * gains[k])
            p, k = max(p, edge), k + 1
        return t


class JobView:
    """What a scheduler knows about one job. It has no true work and no true rate: `progress` is
    the samples the job reported (exact when it stopped last; extrapolated with the measured rate
    while it runs), `measured_rate` the samples/s measured on its current shape (with noise), in
    samples at the submitted batch: at another `batch` the measured throughput times the
    efficiency its measured `noise_scale` gives (efficiency.py). Progress counts the same way."""

    __slots__ = ("job_id", "name", "app", "arrival", "gpus", "batch_size", "target_loss", "_placement", "held_gpus",
                 "shape", "since", "busy_until", "first_start", "started_before", "restarts", "attained", "progress",
                 "measured_rate", "est_end", "loss_reports", "batch", "noise_scale")

    def __init__(self, job_id: int, name: str, app: str, arrival: float, gpus: int, batch_size: int,
                 target_loss: float = 0.0) -> None:
        self.job_id, self.name, self.app, self.arrival = job_id, name, app, arrival
        self.gpus, self.batch_size, self.target_loss = gpus, batch_size, target_loss
        self.placement: Placement = ()
        self.shape: Shape = ()
        self.since = arrival
        self.busy_until = 0.0
        self.first_start: float | None = None
        self.started_before = False
        self.restarts = 0
        self.attained = 0.0         # GPU-seconds held up to `since` (Tiresias' service)
        self.progress = 0.0         # samples processed up to `since`, as reported
        self.measured_rate = 0.0    # samples/s measured on `shape` (0 while waiting)
        self.est_end = math.inf     # the scheduler's estimate of the end while running
        self.loss_reports: list[tuple[float, float]] = []  # (samples processed, training loss)
        self.batch = batch_size     # global batch it runs (ran) with
        self.noise_scale = 0.0      # gradient noise scale measured when it last started (0: never)

    @classmethod
    def of(cls, spec: JobSpec, target_loss: float = 0.0) -> JobView:
        return cls(spec.job_id, spec.name, spec.app, spec.arrival, spec.gpus, spec.batch_size, target_loss)

    @property
    def placement(self) -> Placement:
        return self._placement

    @placement.setter
    def placement(self, placement: Placement) -> None:
        self._placement = placement
        self.held_gpus = sum(map(gpus_of, placement))   # read in every decision's walk: kept, not summed

    def progress_at(self, now: float) -> float:
        if not self.placement:
            return self.progress
        return self.progress + self.measured_rate * max(0.0, now - max(self.since, self.busy_until))

    def attained_at(self, now: float) -> float:
        return self.attained + self.held_gpus * (now - self.since) if self.placement else self.attained

    def elapsed_at(self, now: float) -> float:
        """Seconds since the job first started (0 before)."""
        return 0.0 if self.first_start is None else now - self.first_start

    def __repr__(self) -> str:
        return f"JobView({self.name}, {self.app}, gpus={self.gpus}, shape={self.shape})"


class WorkHistory:
    """Samples processed by finished jobs, per application: what a scheduler learns from the jobs
    it has run. The estimate of a job's total work is the median over finished jobs of its
    application that did more than it has done so far (3Sigma-style prediction from history)."""

    def __init__(self) -> None:
        # plain sorted lists: every estimate bisects one (in C), far more often than a job finishes
        self.by_app: dict[str, list[float]] = {}

    def add(self, app: str, samples: float) -> None:
        insort(self.by_app.setdefault(app, []), samples)

    def total_work(self, app: str, progress: float) -> float | None:
        done = self.by_app.get(app)
        if not done:
            return None
        i = bisect_right(done, progress)
        if i == len(done):
            return None  # it already did more than any finished job of its kind
        return done[(i + len(done)) // 2]


def estimated_remaining(history: WorkHistory, job: JobView, now: float, fallback_rate: float) -> float:
    """Samples left by the history's estimate; without one, the job is expected to run as long
    again as it has (at least DEFAULT_RUNTIME_S at `fallback_rate` samples/s)."""
    progress = job.progress_at(now)
    total = history.total_work(job.app, progress)
    if total is None:
        return max(progress, DEFAULT_RUNTIME_S * fallback_rate)
    return total - progress


@dataclass
class ClusterState:
    """Everything a policy may read. `queue` keeps (re)entry order; `by_end` holds (estimated
    end, job_id) of running jobs, earliest first (estimates already passed count as now).
    `arrived` and `finished` are append-only journals of job ids, so a policy that keeps an index
    (tiresias) can follow changes from a cursor instead of rescanning the queue; a caller that
    builds a fresh state per decision may leave them empty (the policy then rebuilds). `samples`
    journals measured throughputs the same way."""

    spec: ClusterSpec
    free: FreeMap
    now: float = 0.0
    queue: dict[int, JobView] = field(default_factory=dict)
    running: dict[int, JobView] = field(default_factory=dict)
    by_end: SortedList = field(default_factory=SortedList)
    restart_cost: float = 0.0
    history: WorkHistory = field(default_factory=WorkHistory)
    arrived: list[int] = field(default_factory=list)
    finished: list[int] = field(default_factory=list)
    # throughput samples the cluster reported, (app, shape, global batch, samples/s measured with
    # noise), one per start or resize, append-only: what policies.learned.LearnedModel learns from
    samples: list[tuple[str, Shape, int, float]] = field(default_factory=list)
    # ids of running jobs that reported a fresh gradient noise scale (JobView.noise_scale), append-only
    noise_reports: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class Start:
    job_id: int
    placement: Placement
    shape: Shape | None = None  # defaults to the placement's per-node counts
    batch: int | None = None    # global batch to run with (None: the submitted one)


@dataclass(frozen=True)
class Preempt:
    job_id: int


@dataclass(frozen=True)
class Resize:
    """Checkpoint-restart a running job onto a new placement (pays the restart cost)."""

    job_id: int
    placement: Placement
    shape: Shape | None = None
    batch: int | None = None


@dataclass(frozen=True)
class Rebatch:
    """Change a running job's global batch in place, as an adaptive-batch job does between steps
    (AdaptDL): no restart, same GPUs. A caller that cannot (the daemon) ignores it."""

    job_id: int
    batch: int


Action = Start | Preempt | Resize | Rebatch


@dataclass(frozen=True)
class Decision:
    actions: tuple[Action, ...] = ()
    wake_at: float | None = None  # ask to be called again at this time even if nothing happens
