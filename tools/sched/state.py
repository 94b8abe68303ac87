"""What a policy sees and what it returns.

The simulator (and, on the roadmap, the scheduler daemon) owns the state and updates it
incrementally; a policy reads it and returns actions. Policies must not mutate it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from sortedcontainers import SortedList

from mlsyskit.tools.sched.cluster import ClusterSpec, FreeMap, Placement
from mlsyskit.tools.sched.profiles import Shape


@dataclass(frozen=True)
class JobSpec:
    job_id: int
    name: str
    app: str
    arrival: float       # seconds
    gpus: int            # GPUs the user asked for
    batch_size: int      # global batch, kept fixed whatever the allocation
    work: float          # samples to process until the job is done


@dataclass
class JobRecord:
    """Mutable progress of one job; owned by the simulator."""

    spec: JobSpec
    done: float = 0.0               # samples processed up to `since`
    attained: float = 0.0           # GPU-seconds held up to `since` (Tiresias' service)
    since: float = 0.0
    placement: Placement = ()       # GPUs held (may exceed the shape for exclusive nodes)
    shape: Shape = ()               # GPUs the job computes on
    rate: float = 0.0               # samples/s on `shape`
    busy_until: float = 0.0         # checkpoint-restart in progress until then (no progress)
    first_start: float | None = None
    started_before: bool = False    # a later start pays the restart cost
    restarts: int = 0
    end_estimate: float = float("inf")

    @property
    def held_gpus(self) -> int:
        return sum(g for _, g in self.placement)

    def done_at(self, now: float) -> float:
        if not self.placement:
            return self.done
        return self.done + self.rate * max(0.0, now - max(self.since, self.busy_until))

    def remaining(self, now: float) -> float:
        return max(0.0, self.spec.work - self.done_at(now))

    def attained_at(self, now: float) -> float:
        return self.attained + self.held_gpus * (now - self.since) if self.placement else self.attained


@dataclass
class ClusterState:
    """Everything a policy may read. `queue` keeps (re)entry order; `by_end` holds
    (end estimate, job_id) of running jobs, earliest first."""

    spec: ClusterSpec
    free: FreeMap
    now: float = 0.0
    queue: dict[int, JobRecord] = field(default_factory=dict)
    running: dict[int, JobRecord] = field(default_factory=dict)
    by_end: SortedList = field(default_factory=SortedList)
    restart_cost: float = 0.0


@dataclass(frozen=True)
class Start:
    job_id: int
    placement: Placement
    shape: Shape | None = None  # defaults to the placement's per-node counts


@dataclass(frozen=True)
class Preempt:
    job_id: int


@dataclass(frozen=True)
class Resize:
    """Checkpoint-restart a running job onto a new placement (pays the restart cost)."""

    job_id: int
    placement: Placement
    shape: Shape | None = None


Action = Start | Preempt | Resize


@dataclass(frozen=True)
class Decision:
    actions: tuple[Action, ...] = ()
    wake_at: float | None = None  # ask to be called again at this time even if nothing happens
