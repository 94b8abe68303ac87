"""marble-admit (marble before its Pollux-style allocation): elastic GPU counts from the scaling curve, LAS order, bounded
restarts, starvation guard; and every policy on random mixed-size clusters (a property test)."""
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sched_toy import FLAT, LINEAR, SUB, job, run_job, state_with, toy_model

from mlsyskit.tools.sched.cluster import ClusterSpec
from mlsyskit.tools.sched.experiment import WorkloadSource, run_one
from mlsyskit.tools.sched.policies import DEFAULT_POLICY, POLICIES, PolicyOptions, create_policy
from mlsyskit.tools.sched.simulator import Simulator
from mlsyskit.tools.sched.state import JobSpec, Preempt, Resize, Start
from mlsyskit.tools.sched.throughput import ThroughputModel

MODEL = toy_model({"lin": LINEAR, "flat": FLAT, "sub": SUB})
ONE_NODE = ClusterSpec(1, 6)
TRUTH = ThroughputModel()


def starts(decision):
    return {a.job_id: a for a in decision.actions if isinstance(a, Start)}


def test_marble_is_the_default():
    assert DEFAULT_POLICY == "marble" and DEFAULT_POLICY in POLICIES


def test_an_idle_cluster_gives_a_job_that_scales_more_than_it_asked():
    # lin scales perfectly: asked 2, it may get up to 4 x 2 = 8 > 6, so the whole node
    assert starts(create_policy("marble-admit", MODEL).decide(state_with(ONE_NODE, [job(1, "lin", 2, 1e6)])))[1].shape == (6,)
    # elastic_max_scale bounds it: at most 1.5 x 2 = 3
    opts = PolicyOptions(elastic_max_scale=1.5)
    assert starts(create_policy("marble-admit", MODEL, opts).decide(state_with(ONE_NODE, [job(1, "lin", 2, 1e6)])))[1].shape == (3,)


def test_a_flat_curve_gets_fewer_gpus_than_asked_and_no_more_when_idle():
    # flat: 1 -> 2 GPUs adds 0.8 of a GPU, 2 -> 3 only 0.2 (< admit 0.35 and < grow 0.3): 2 of the 6
    d = create_policy("marble-admit", MODEL).decide(state_with(ONE_NODE, [job(1, "flat", 6, 1e6)]))
    assert starts(d)[1].shape == (2,)


def test_grown_jobs_shrink_back_when_a_new_job_needs_the_gpus():
    state = state_with(ONE_NODE, [job(2, "sub", 2, 1e5)], now=100.0)
    state.restart_cost = 30.0
    run_job(state, MODEL, job(1, "lin", 2, 1e8), [(0, 6)])   # lin asked 2 and was grown to 6
    policy = create_policy("marble-admit", MODEL)
    d = policy.decide(state)
    resized = [a for a in d.actions if isinstance(a, Resize)]
    # lin's p* is 2 (what it asked): it shrinks to 2, never preempted; sub starts on what that frees
    assert [(a.job_id, sum(a.shape)) for a in resized] == [(1, 2)]
    assert not [a for a in d.actions if isinstance(a, Preempt)]
    assert sum(starts(d)[2].shape) >= 2


def test_a_running_job_grows_at_most_once_per_resize_interval():
    opts = PolicyOptions(resize_interval=3600.0, grow_period=60.0)
    state = state_with(ONE_NODE, [], now=1000.0)
    state.restart_cost = 30.0
    run_job(state, MODEL, job(1, "lin", 4, 1e9), [(0, 4)])
    state.free.take(((0, 1),))          # one GPU out of service: one is free
    policy = create_policy("marble-admit", MODEL, opts)
    first = policy.decide(state)
    assert [(type(a), sum(a.shape)) for a in first.actions] == [(Resize, 5)]
    view = state.running[1]              # applied as the simulator would
    state.free.give(view.placement)
    view.placement, view.shape = first.actions[0].placement, first.actions[0].shape
    state.free.take(view.placement)
    state.free.give(((0, 1),))           # 10 minutes later the GPU is back: one more is free
    state.now = 1600.0
    again = policy.decide(state)
    assert again.actions == () and again.wake_at is not None
    state.now = 1000.0 + 3600.0          # growth allowed again
    assert [(type(a), sum(a.shape)) for a in policy.decide(state).actions] == [(Resize, 6)]


def test_the_starvation_guard_puts_a_long_waiting_job_first():
    spec = ClusterSpec(1, 6)
    opts = PolicyOptions(starvation_s=3600.0)
    # j1 has waited 2 h (since t=0) with much attained service; j2 arrived just now with none
    state = state_with(spec, [job(1, "lin", 6, 1e9), job(2, "lin", 6, 1e9, arrival=7000.0)], now=7200.0)
    state.queue[1].attained, state.queue[1].since = 1e6, 0.0
    assert set(starts(create_policy("marble-admit", MODEL, opts).decide(state))) == {1}
    # without the guard least-attained-service picks the newcomer
    state.queue[1].since = 7000.0
    assert set(starts(create_policy("marble-admit", MODEL, PolicyOptions(starvation_s=3600.0)).decide(state))) == {2}


def test_the_one_row_repro_on_mixed_nodes_finishes_under_every_policy(tmp_path):
    # 48 GPUs of imagenet on 8 nodes of 4 + 4 of 8: no layout for the largest node size fits
    # (6 nodes of 8), so policies used to leave it waiting forever
    path = tmp_path / "one.csv"
    path.write_text("name,time,application,num_replicas,batch_size\nimagenet-137,0,imagenet,48,6400\n")
    spec = ClusterSpec.parse("8x4+4x8")
    for name in sorted(POLICIES):
        run = run_one(WorkloadSource(str(path)), spec, name, 0, TRUTH, PolicyOptions(), 30.0)
        assert run.summary["jobs"] == 1, name


APPS = ["bert", "cifar10", "deepspeech2", "imagenet", "ncf", "yolov3"]
BATCH = {"bert": 384, "cifar10": 2048, "deepspeech2": 320, "imagenet": 3200, "ncf": 32768, "yolov3": 64}


@st.composite
def mixed_cluster_and_jobs(draw):
    sizes = draw(st.lists(st.integers(1, 8), min_size=2, max_size=6))
    if len(set(sizes)) == 1:
        sizes.append(sizes[0] % 8 + 1)   # at least two node sizes
    spec = ClusterSpec.of_nodes(sizes)
    n = draw(st.integers(1, 10))
    jobs = []
    for i in range(n):
        app = draw(st.sampled_from(APPS))
        gpus = draw(st.integers(1, spec.total_gpus))            # anything up to the cluster's GPUs is admissible
        arrival = float(draw(st.integers(0, 3600)))
        hours = draw(st.floats(0.01, 2.0))
        rate = TRUTH.rate(app, (1,), BATCH[app])
        jobs.append(JobSpec(i, f"j{i}", app, arrival, gpus, BATCH[app], hours * 3600 * rate))
    return spec, jobs


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mixed_cluster_and_jobs())
def test_every_admissible_job_eventually_runs_on_random_mixed_clusters(case):
    spec, jobs = case
    for name in sorted(POLICIES):
        result = Simulator(spec, create_policy(name, TRUTH), TRUTH, jobs, restart_cost=30.0).run()
        # run() raises PolicyError when jobs are left waiting with nothing pending: every one finished
        assert set(result.finish) == {j.job_id for j in jobs}, name
        assert all(r.first_start is not None for r in result.jobs), name


def test_marble_steps_over_the_node_boundary_dip_that_stops_a_one_gpu_greedy():
    # lin on 3 nodes of 6: 7 GPUs (6+1, slow network) run slower than 6 on one node, 18 faster than
    # both; pollux's one-GPU-at-a-time greedy stops at 6, marble's envelope step takes all 18
    spec = ClusterSpec(3, 6)
    shapes = {name: starts(create_policy(name, MODEL).decide(state_with(spec, [job(1, "lin", 6, 1e9)])))[1].shape
              for name in ("marble", "pollux")}
    assert shapes == {"marble": (6, 6, 6), "pollux": (6,)}
