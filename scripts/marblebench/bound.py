"""bench_marble's oracle-order bound: marble as shipped, except that it ranks jobs by their TRUE
remaining work (read from the trace). Benchmark-only (never registered as a policy, never a
default): it says how much of the gap to a target any better size estimate could close while
marble keeps its sizes, queues and restarts. Everything else (throughput model, measurements)
is what the shipped policy gets.
"""
from __future__ import annotations

from mlsyskit.tools.sched.cluster import ClusterSpec
from mlsyskit.tools.sched.experiment import policy_model
from mlsyskit.tools.sched.metrics import summarize
from mlsyskit.tools.sched.policies import PolicyOptions
from mlsyskit.tools.sched.policies.marble import Marble
from mlsyskit.tools.sched.simulator import Simulator
from mlsyskit.tools.sched.state import JobSpec, JobView
from mlsyskit.tools.sched.throughput import ThroughputModel


class OracleOrder(Marble):
    name = "marble-oracle-order"
    description = "benchmark-only bound: marble ranking by true remaining work"

    def __init__(self, model, true_work: dict[int, float], options=None) -> None:
        super().__init__(model, options)
        self._true_work = true_work

    def rank(self, job: JobView) -> float:
        left = self._true_work[job.job_id] - job.progress_at(self._state.now)
        return left / self.curve(self._state, job)[3][1]


def oracle_order_jct(jobs: list[JobSpec], spec: ClusterSpec, seed: int, truth: ThroughputModel,
                     restart_cost: float) -> dict:
    """One replay of the bound: the summary (avg_jct_s, max_slowdown, ...)."""
    learned = policy_model(truth, seed=seed)
    policy = OracleOrder(learned, {j.job_id: j.work for j in jobs}, PolicyOptions())
    sim = Simulator(spec, policy, truth, jobs, restart_cost=restart_cost, seed=seed, samples=learned.samples)
    return summarize(sim.run(), spec.total_gpus)
