import json
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sched_toy import FLAT, LINEAR, job, toy_model

from mlsyskit.tools.sched.cluster import ClusterSpec
from mlsyskit.tools.sched.experiment import WorkloadSource, report, run_one
from mlsyskit.tools.sched.policies import POLICIES, PolicyOptions, create_policy
from mlsyskit.tools.sched.simulator import PolicyError, Simulator
from mlsyskit.tools.sched.state import Decision, Start
from mlsyskit.tools.sched.throughput import ThroughputModel

MODEL = toy_model({"lin": LINEAR, "flat": FLAT})


class CheckedSimulator(Simulator):
    """Checks GPU conservation after every decision."""

    def _decide(self) -> None:
        super()._decide()
        state, spec = self.state, self.spec
        held = Counter()
        for rec in state.running.values():
            for node, gpus in rec.placement:
                held[node] += gpus
        for node in range(spec.nodes):
            assert 0 <= state.free.free[node] <= spec.capacity(node)
            assert held[node] + state.free.free[node] == spec.capacity(node)
            assert node in state.free.buckets[state.free.free[node]]
        assert spec.total_gpus - state.free.total == sum(held.values()) <= spec.total_gpus


jobs_strategy = st.lists(
    st.tuples(st.sampled_from(["lin", "flat"]), st.integers(1, 12), st.floats(10.0, 1e5),
              st.floats(0.0, 2000.0)),
    min_size=1, max_size=25)


@pytest.mark.parametrize("policy", sorted(POLICIES))
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes=st.integers(1, 3), gpn=st.sampled_from([2, 4, 6]), raw=jobs_strategy,
       restart=st.sampled_from([0.0, 30.0]))
def test_gpus_are_conserved_and_every_job_finishes(policy, nodes, gpn, raw, restart):
    spec = ClusterSpec(nodes, gpn)
    jobs = [job(i, app, min(g, spec.total_gpus), work, arrival) for i, (app, g, work, arrival) in enumerate(raw)]
    opts = PolicyOptions(optimus_interval=300.0, tiresias_thresholds=(600.0, 6000.0))
    sim = CheckedSimulator(spec, create_policy(policy, MODEL, opts), MODEL, jobs, restart_cost=restart)
    result = sim.run()
    assert len(result.finish) == len(jobs)
    for rec in result.jobs:
        assert rec.done == rec.spec.work
        assert result.finish[rec.spec.job_id] >= rec.first_start >= rec.spec.arrival
    assert result.gpu_seconds_held <= spec.total_gpus * (result.makespan_end - result.makespan_start) + 1e-6


@pytest.mark.parametrize("policy", sorted(POLICIES))
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sizes=st.lists(st.sampled_from([2, 4, 6]), min_size=2, max_size=4).filter(lambda s: len(set(s)) > 1),
       raw=jobs_strategy)
def test_mixed_nodes_never_hold_more_than_their_own_gpus(policy, sizes, raw):
    # Nodes of different sizes: after every decision each node holds at most its own GPUs. Jobs ask
    # at most what the largest nodes hold together (exclusive whole-node policies use only those).
    spec = ClusterSpec.of_nodes(sizes)
    largest = spec.gpus_per_node * sizes.count(spec.gpus_per_node)
    jobs = [job(i, app, min(g, largest), work, arrival) for i, (app, g, work, arrival) in enumerate(raw)]
    opts = PolicyOptions(optimus_interval=300.0, tiresias_thresholds=(600.0, 6000.0))
    result = CheckedSimulator(spec, create_policy(policy, MODEL, opts), MODEL, jobs, restart_cost=30.0).run()
    assert len(result.finish) == len(jobs)


def test_same_seed_same_json_and_another_seed_differs():
    model = ThroughputModel()
    spec = ClusterSpec(16, 6)
    source = WorkloadSource("workload-3")

    def doc(seed):
        runs = [run_one(source, spec, p, seed, model, PolicyOptions(), 30.0) for p in ("marble", "tiresias", "optimus")]
        return json.dumps(report(runs, source, spec, PolicyOptions(), 30.0), sort_keys=True)

    assert doc(3) == doc(3)
    assert doc(3) != doc(4)


class Greedy:
    """A broken policy that starts every waiting job on node 0 regardless of free GPUs."""

    name = "greedy"

    def decide(self, state):
        return Decision(tuple(Start(j, ((0, state.spec.gpus_per_node),)) for j in state.queue))


def test_a_policy_that_over_allocates_is_stopped():
    jobs = [job(1, "lin", 6, 1e4), job(2, "lin", 6, 1e4)]
    with pytest.raises(PolicyError, match="node 0 has 0 free GPUs"):
        Simulator(ClusterSpec(1, 6), Greedy(), MODEL, jobs).run()


class Idle:
    name = "idle"

    def decide(self, state):
        return Decision()


def test_a_policy_that_never_starts_a_job_is_reported():
    with pytest.raises(PolicyError, match="left 1 job"):
        Simulator(ClusterSpec(1, 6), Idle(), MODEL, [job(1, "lin", 1, 10)]).run()


def test_jobs_larger_than_the_cluster_are_rejected_up_front():
    with pytest.raises(ValueError, match="more GPUs than the cluster has"):
        Simulator(ClusterSpec(1, 6), Idle(), MODEL, [job(1, "lin", 7, 10)])


def test_preempted_work_is_kept_and_the_restart_cost_paid():
    # tiresias, one 6-GPU node: job 1 (6 GPUs, 6000 s of work alone) runs from t=0; job 2 arrives at
    # t=1000 with less attained service once job 1 passed 3600 GPU-s (t=600), so job 1 is preempted
    # at 1000 and resumes when job 2 (600 s) ends at 1600, paying 30 s: it ends at 1600+30+5000.
    jobs = [job(1, "lin", 6, 60.0 * 6000), job(2, "lin", 6, 60.0 * 600, arrival=1000.0)]
    opts = PolicyOptions(tiresias_thresholds=(3600.0,))
    res = Simulator(ClusterSpec(1, 6), create_policy("tiresias", MODEL, opts), MODEL, jobs, restart_cost=30).run()
    assert res.finish == pytest.approx({2: 1600.0, 1: 6630.0})
    assert res.counters["preemptions"] == 1


def test_non_finite_arrivals_and_work_are_rejected_up_front():
    # A NaN arrival never compares as due, so the replay would spin forever instead of failing.
    for bad in (job(1, "lin", 1, 10.0, arrival=float("nan")), job(1, "lin", 1, float("inf")), job(1, "lin", 1, 0.0)):
        with pytest.raises(ValueError, match="non-finite arrival or no finite positive work"):
            Simulator(ClusterSpec(1, 6), Idle(), MODEL, [bad])
