"""Policies on small hand-made clusters whose right answer is worked out in the comments."""
import copy

import pytest
from sched_toy import DIP, FLAT, LINEAR, SUB, job, run_job, state_with, toy_model

from mlsyskit.tools.sched.cluster import ClusterSpec
from mlsyskit.tools.sched.policies import POLICIES, Policy, PolicyOptions, create_policy, register
from mlsyskit.tools.sched.policies.sizing import sized_shapes
from mlsyskit.tools.sched.simulator import Simulator
from mlsyskit.tools.sched.state import Preempt, Resize, Start

MODEL = toy_model({"lin": LINEAR, "flat": FLAT, "dip": DIP, "sub": SUB})
ONE_NODE = ClusterSpec(1, 6)
TWO_NODES = ClusterSpec(2, 6)


def starts(decision):
    return {a.job_id: a for a in decision.actions if isinstance(a, Start)}


def test_registry_has_the_six_policies_and_rejects_bad_names():
    assert sorted(POLICIES) == ["backfill", "fifo", "marble", "marble-admit", "marble-elastic", "marble-fifo", "marble-las",
                              "optimus", "pollux", "tiresias"]
    with pytest.raises(KeyError, match="unknown policy"):
        create_policy("lsf", MODEL)

    class Again(Policy):
        name = "fifo"
        description = "duplicate"

        def decide(self, state):
            raise NotImplementedError

    with pytest.raises(ValueError, match="registered twice"):
        register(Again)


def test_marble_size_comes_from_the_efficiency_curve():
    # Marginal gains in single-GPU throughputs (T(1) = 10/s) along the concave envelope.
    # flat: 1->2 GPUs adds 8/s = 0.8 (>= 0.5, kept); from 2 the steepest step is 2->3, 0.2: stops at 2
    assert sum(sized_shapes(MODEL, "flat", 60, 6, 6, 0.5)[-1]) == 2
    assert sum(sized_shapes(MODEL, "lin", 60, 6, 6, 0.5)[-1]) == 6
    # at 0.15: 2->3 adds 0.2 (kept); from 3 the steepest is 3->4, 0.1: stops at 3
    assert sum(sized_shapes(MODEL, "flat", 60, 6, 6, 0.15)[-1]) == 3
    assert sum(sized_shapes(MODEL, "lin", 60, 4, 6, 0.5)[-1]) == 4    # never more than asked
    # sub: gains 1, 0.9, 0.7, 0.6, 0.3, 0.2 (already concave): 4 at 0.5, 2 at 0.8
    assert sum(sized_shapes(MODEL, "sub", 60, 6, 6, 0.5)[-1]) == 4
    assert sum(sized_shapes(MODEL, "sub", 60, 6, 6, 0.8)[-1]) == 2


def test_marble_size_bridges_a_dip_in_the_measured_curve():
    # dip: T = 10, 19, 18, 36, 37, 38. One more GPU from 2 loses 0.1 of a GPU, but the envelope
    # from 2 goes straight to 4: (36 - 19) / 2 = 8.5/s per GPU = 0.85 (kept); from 4 the steepest
    # step adds 0.1: stops at 4. A walk that stopped at the first small gain would give 2.
    assert sum(sized_shapes(MODEL, "dip", 60, 6, 6, 0.5)[-1]) == 4
    # at 0.9: 1->2 adds 0.9 (kept), the envelope step 2->4 only 0.85: stops at 2
    assert sum(sized_shapes(MODEL, "dip", 60, 6, 6, 0.9)[-1]) == 2


def test_fifo_gives_whole_nodes_and_is_strict():
    state = state_with(TWO_NODES, [job(1, "lin", 1, 100), job(2, "lin", 12, 100), job(3, "lin", 1, 100)])
    d = create_policy("fifo", MODEL).decide(state)
    s = starts(d)
    assert list(s) == [1]                      # job 2 needs two whole nodes; job 3 may not pass it
    assert s[1].placement == ((0, 6),) and s[1].shape == (1,)


def test_backfill_lets_only_a_job_that_ends_before_the_reservation_pass():
    # What the policy knows of run times comes from finished jobs of each application (history):
    # lin jobs did 6000 samples (100 s on 6 GPUs), flat ones 22 x 500 (500 s), sub ones 37 x 50 (50 s).
    history = {"lin": [6000.0], "flat": [22.0 * 500], "sub": [37.0 * 50]}
    state = state_with(TWO_NODES, [], now=0.0, history=history)
    run_job(state, MODEL, job(9, "lin", 6, 6000.0), [(0, 6)])   # node 0 busy until t=100 (estimated)
    for j in (job(1, "dip", 12, 1000), job(2, "flat", 6, 1e9), job(3, "sub", 6, 1e9)):
        state.queue[j.job_id] = state_with(TWO_NODES, [j]).queue[j.job_id]
    # head (12 GPUs) waits for t=100; job 2 would run 500 s on node 1 -> delays the head; job 3 runs 50 s
    # (their true work, 1e9 samples, is not known to the policy and does not matter)
    assert list(starts(create_policy("backfill", MODEL).decide(state))) == [3]
    assert list(starts(create_policy("fifo", MODEL).decide(state))) == []


def test_marble_packs_two_jobs_on_one_node_where_fifo_serialises_them():
    # A (flat, asks 6) is efficient on 2 GPUs; B (lin, asks 4) on 4: both fit on the 6-GPU node.
    a, b = job(1, "flat", 6, 36000.0), job(2, "lin", 4, 144000.0)
    d = create_policy("marble-fifo", MODEL).decide(state_with(ONE_NODE, [a, b]))
    s = starts(d)
    assert {k: v.shape for k, v in s.items()} == {1: (2,), 2: (4,)}
    # End to end: marble A = 36000/18 = 2000 s, B = 144000/40 = 3600 s -> mean 2800 s.
    # fifo: A alone on the node at 22/s = 1636.4 s, then B 3600 s -> B ends at 5236.4 s.
    res = {p: Simulator(ONE_NODE, create_policy(p, MODEL), MODEL, [a, b], restart_cost=0).run()
           for p in ("marble-fifo", "fifo")}
    assert res["marble-fifo"].finish == pytest.approx({1: 2000.0, 2: 3600.0})
    assert res["fifo"].finish == pytest.approx({1: 36000 / 22, 2: 36000 / 22 + 3600})


def test_marble_best_fit_fills_the_fuller_node_first():
    state = state_with(TWO_NODES, [job(1, "flat", 2, 100)])
    run_job(state, MODEL, job(9, "lin", 4, 1e6), [(1, 4)])   # node 1 has 2 free, node 0 has 6
    assert starts(create_policy("marble-fifo", MODEL).decide(state))[1].placement == ((1, 2),)


def test_marble_starts_small_when_that_beats_waiting():
    # lin asks 6 (efficient at 6) but only 4 are free; finished lin jobs did 60000 samples, so this
    # one is expected to as well. The 2 busy GPUs hold a flat job expected to end at t=1e5.
    history = {"lin": [60.0 * 1000], "flat": [18.0 * 1e5]}
    state = state_with(ONE_NODE, [job(1, "lin", 6, 1.0)], history=history)
    run_job(state, MODEL, job(9, "flat", 2, 1.0), [(0, 2)])
    # now on 4 GPUs: 60000/40 = 1500 s; waiting: 1e5 + 1000 s -> start small
    assert starts(create_policy("marble-fifo", MODEL).decide(state))[1].shape == (4,)
    # if the busy GPUs are expected to free at t=10, waiting (10 + 1000 s) beats 1500 s on 4 GPUs
    state = state_with(ONE_NODE, [job(1, "lin", 6, 1.0)], history={"lin": [60.0 * 1000], "flat": [18.0 * 10]})
    run_job(state, MODEL, job(9, "flat", 2, 1.0), [(0, 2)])
    assert starts(create_policy("marble-fifo", MODEL).decide(state)) == {}


def test_marble_sizes_for_the_cluster_under_queue_pressure():
    # Alone, a sub job asking 6 gets p* = 4 (threshold 0.5).
    assert starts(create_policy("marble-fifo", MODEL).decide(state_with(ONE_NODE, [job(1, "sub", 6, 1e4)])))[1].shape == (4,)
    # Two of them want 4 + 4 = 8 > 6 free GPUs: the first is sized at the pressure threshold (0.8):
    # 2 GPUs (its third would add 0.7). Then the second alone wants 4 <= 4 free: it gets 4.
    d = create_policy("marble-fifo", MODEL).decide(state_with(ONE_NODE, [job(1, "sub", 6, 1e4), job(2, "sub", 6, 1e4)]))
    assert {k: v.shape for k, v in starts(d).items()} == {1: (2,), 2: (4,)}
    # pressure_threshold at or below the efficiency threshold turns the rule off: the first gets 4;
    # the second's 4 do not fit, and with nothing running that would free them (the first started
    # in this same decision) waiting has no end, so it starts on the 2 GPUs left.
    opts = PolicyOptions(pressure_threshold=0.5)
    d = create_policy("marble-fifo", MODEL, opts).decide(state_with(ONE_NODE, [job(1, "sub", 6, 1e4), job(2, "sub", 6, 1e4)]))
    assert {k: v.shape for k, v in starts(d).items()} == {1: (4,), 2: (2,)}


def test_marble_elastic_grows_a_shrunken_job_when_gpus_free_up():
    state = state_with(ONE_NODE, [], now=0.0)
    run_job(state, MODEL, job(1, "lin", 6, 60.0 * 10000), [(0, 4)])  # 4 of its 6 efficient GPUs
    state.restart_cost = 30.0
    d = create_policy("marble-elastic", MODEL).decide(state)
    # remaining 600000 samples: 15000 s on 4 GPUs vs 30 + 10000 s on 6 -> grow
    assert [type(a) for a in d.actions] == [Resize] and d.actions[0].shape == (6,)
    assert create_policy("marble-fifo", MODEL).decide(state).actions == ()


def test_marble_elastic_does_not_grow_into_gpus_a_waiting_job_is_promised():
    history = {"lin": [60.0 * 10000], "dip": [1e7]}    # sizes of finished jobs: all the policy knows
    state = state_with(ONE_NODE, [job(2, "flat", 2, 1.0)], now=0.0, history=history)
    run_job(state, MODEL, job(1, "lin", 6, 1.0), [(0, 4)])    # expected to end at t=15000
    state.restart_cost = 30.0
    # the waiting job fits (2 free GPUs) and starts; nothing is left to grow into
    d = create_policy("marble-elastic", MODEL).decide(state)
    assert [type(a) for a in d.actions] == [Start]
    # job 3 (dip, p* = 4, 1e7 samples) would take 1e7/19 s on the 2 free GPUs, so it waits and
    # holds a reservation at t=15000 when job 1 ends; growing job 1 (it then ends at 10030) is harmless
    state = state_with(ONE_NODE, [job(3, "dip", 6, 1.0)], now=0.0, history=history)
    run_job(state, MODEL, job(1, "lin", 6, 1.0), [(0, 4)])
    state.restart_cost = 30.0
    assert [type(a) for a in create_policy("marble-elastic", MODEL).decide(state).actions] == [Resize]


def test_tiresias_preempts_the_job_with_most_attained_service():
    state = state_with(ONE_NODE, [job(2, "lin", 6, 1000, arrival=5000.0)], now=5000.0)
    old = run_job(state, MODEL, job(1, "lin", 6, 1e9), [(0, 6)])
    old.since, old.attained = 0.0, 0.0     # has held 6 GPUs for 5000 s = 30000 GPU-s: queue 1
    d = create_policy("tiresias", MODEL, PolicyOptions(tiresias_thresholds=(3600.0,))).decide(state)
    assert Preempt(1) in d.actions and 2 in starts(d)


def test_tiresias_asks_to_wake_when_a_job_changes_queue():
    state = state_with(ONE_NODE, [])
    run_job(state, MODEL, job(1, "lin", 6, 1e9), [(0, 6)])
    d = create_policy("tiresias", MODEL, PolicyOptions(tiresias_thresholds=(3600.0,))).decide(state)
    assert d.wake_at == pytest.approx(600.0)   # 3600 GPU-s / 6 GPUs


def test_optimus_gives_the_spare_gpu_to_the_job_that_gains_most():
    # 3 free GPUs, two jobs: each gets 1; the third goes to lin (1->2 GPUs halves its time)
    # rather than flat (10->18/s saves less of a shorter job).
    state = state_with(ClusterSpec(1, 3), [job(1, "flat", 3, 1000), job(2, "lin", 3, 1000)])
    s = starts(create_policy("optimus", MODEL).decide(state))
    assert {k: sum(v.shape) for k, v in s.items()} == {1: 1, 2: 2}


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_decide_does_not_mutate_the_state(name):
    state = state_with(TWO_NODES, [job(i, "lin" if i % 2 else "flat", 1 + i % 6, 1e4) for i in range(1, 8)])
    run_job(state, MODEL, job(99, "flat", 3, 1e6), [(0, 3)])
    before = copy.deepcopy((state.free.free, state.free.total, list(state.queue), list(state.running),
                            list(state.by_end)))
    create_policy(name, MODEL).decide(state)
    after = (state.free.free, state.free.total, list(state.queue), list(state.running), list(state.by_end))
    assert before == after


def test_tiresias_incremental_index_decides_as_a_fresh_rebuild():
    # Every decision of the long-lived policy (index kept across decisions from the journals and
    # crossings) must equal that of a fresh policy that builds its index from the state alone.
    from mlsyskit.tools.sched.experiment import WorkloadSource
    from mlsyskit.tools.sched.throughput import ThroughputModel

    truth = ThroughputModel()
    opts = PolicyOptions(tiresias_thresholds=(600.0, 6000.0))

    class Checked:
        name = "tiresias-checked"

        def __init__(self):
            self.inner, self.compared = create_policy("tiresias", truth, opts), 0

        def decide(self, state):
            reference = create_policy("tiresias", truth, opts).decide(state)
            decision = self.inner.decide(state)
            assert decision.actions == reference.actions, state.now
            self.compared += bool(decision.actions)
            return decision

    spec = ClusterSpec(4, 6)
    jobs = WorkloadSource("synthetic:300@1.5/1:4,2:2,4:1,8:1").load(truth, 3, spec)
    policy = Checked()
    Simulator(spec, policy, truth, jobs, restart_cost=30.0).run()
    assert policy.compared > 100


def test_marble_las_sizes_like_marble_and_preempts_like_tiresias():
    # Sizing: flat asks 6 but is efficient on 2 (marble's p*), lin on 4: both share the node.
    d = create_policy("marble-las", MODEL).decide(state_with(ONE_NODE, [job(1, "flat", 6, 1e4), job(2, "lin", 4, 1e4)]))
    assert {k: v.shape for k, v in starts(d).items()} == {1: (2,), 2: (4,)}
    # Order: a job that has held 6 GPUs for 5000 s (30000 GPU-s, queue 1) is preempted for a new one.
    state = state_with(ONE_NODE, [job(2, "lin", 6, 1000, arrival=5000.0)], now=5000.0)
    old = run_job(state, MODEL, job(1, "lin", 6, 1e9), [(0, 6)])
    old.since, old.first_start = 0.0, 0.0
    d = create_policy("marble-las", MODEL, PolicyOptions(tiresias_thresholds=(3600.0,))).decide(state)
    assert Preempt(1) in d.actions and starts(d)[2].shape == (6,)


def test_marble_las_grows_a_job_started_small_when_nothing_waits():
    # Seven sub jobs asking 6 arrive at once on one 6-GPU node: more jobs wait than GPUs are free,
    # so with pressure sizing on (0.8) each is sized under pressure (2 GPUs; quiet p* is 4). Jobs 2-7 are short (300 s on 2
    # GPUs); when they are done and nothing waits, job 1, still on 2 GPUs, is grown onto 4.
    jobs = [job(1, "sub", 6, 19.0 * 20000), *(job(i, "sub", 6, 19.0 * 300) for i in range(2, 8))]
    opts = PolicyOptions(las_pressure_threshold=0.8)
    result = Simulator(ONE_NODE, create_policy("marble-las", MODEL, opts), MODEL, jobs, restart_cost=30.0).run()
    assert len(result.finish) == 7
    assert result.counters["resizes"] == 1 and result.counters["preemptions"] == 0
    # on 2 GPUs alone it would end at 20000 s; grown to 4 (32/s vs 19/s) around t=1000 it ends near 12300
    assert result.finish[1] < 0.65 * 20000
