"""Hand-made throughput models with known curves, for tests whose right answer is computed by hand."""
from __future__ import annotations

from mlsyskit.tools.sched.cluster import ClusterSpec, FreeMap
from mlsyskit.tools.sched.profiles import AppProfile, Row
from mlsyskit.tools.sched.state import ClusterState, JobSpec, JobView, estimated_remaining
from mlsyskit.tools.sched.throughput import ThroughputModel

BATCH = 60


def toy_model(curves: dict[str, list[float]], gpus_per_node: int = 6) -> ThroughputModel:
    """`curves[app][k-1]` = samples/s on k GPUs of one node, at global batch BATCH; multi-node
    shapes run at the rate of their GPU count times 0.5 (a slow network)."""
    profiles = {}
    for app, rates in curves.items():
        rows = []
        for k, rate in enumerate(rates, start=1):
            local = BATCH / k
            rows.append(Row((k,), 1, k, local, BATCH / rate, 0.0))
        for nodes in (2, 3):
            for k in range(1, gpus_per_node + 1):
                total = k * nodes
                rate = 0.5 * rates[-1] * total / len(rates) if total > len(rates) else 0.5 * rates[total - 1]
                rows.append(Row((k,) * nodes, nodes, total, BATCH / total, BATCH / rate, 0.0))
        profiles[app] = AppProfile(app, rows)
    return ThroughputModel(profiles)


LINEAR = [10.0 * k for k in range(1, 7)]            # perfect scaling
FLAT = [10.0, 18.0, 20.0, 21.0, 21.5, 22.0]          # saturates after 2 GPUs
DIP = [10.0, 19.0, 18.0, 36.0, 37.0, 38.0]           # a noisy dip at 3 GPUs, then 4 scale well
SUB = [10.0, 19.0, 26.0, 32.0, 35.0, 37.0]           # gains 0.9, 0.7, 0.6, 0.3, 0.2 of one GPU


def job(job_id: int, app: str, gpus: int, work: float, arrival: float = 0.0) -> JobSpec:
    return JobSpec(job_id, f"{app}-{job_id}", app, arrival, gpus, BATCH, work)


def state_with(spec: ClusterSpec, queued: list[JobSpec], now: float = 0.0,
               history: dict[str, list[float]] | None = None) -> ClusterState:
    """A state with `queued` waiting; `history[app]` = sizes (samples) of finished jobs of `app`,
    which is all a policy knows about how long a job will run."""
    state = ClusterState(spec, FreeMap(spec), now=now)
    for app, sizes in (history or {}).items():
        for size in sizes:
            state.history.add(app, size)
    for j in queued:
        view = JobView.of(j)
        view.since = now
        state.queue[j.job_id] = view
    return state


def run_job(state: ClusterState, model: ThroughputModel, spec: JobSpec, placement, shape=None) -> JobView:
    """Put a job in `state` as running since state.now on `placement` (bookkeeping as the simulator
    does, with an exact rate measurement)."""
    view = JobView.of(spec)
    view.since, view.first_start, view.started_before = state.now, state.now, True
    view.placement = tuple(placement)
    view.shape = tuple(sorted(shape or [g for _, g in placement], reverse=True))
    view.measured_rate = model.rate(spec.app, view.shape, spec.batch_size)
    view.est_end = state.now + estimated_remaining(state.history, view, state.now, view.measured_rate) / view.measured_rate
    state.free.take(view.placement)
    state.running[spec.job_id] = view
    state.by_end.add((view.est_end, spec.job_id))
    return view
