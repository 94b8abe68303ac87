"""Incremental decision structures decide exactly as a full rescan (seeded congested replays)."""
from mlsyskit.tools.sched.cluster import ClusterSpec
from mlsyskit.tools.sched.experiment import WorkloadSource
from mlsyskit.tools.sched.policies import PolicyOptions, create_policy
from mlsyskit.tools.sched.simulator import Simulator
from mlsyskit.tools.sched.throughput import ThroughputModel

TRUTH = ThroughputModel()


class Compared:
    """Runs the policy under test and, on the same state, a reference that rescans in full."""

    def __init__(self, name: str, options: PolicyOptions) -> None:
        self.name = f"{name}-compared"
        self.inner = create_policy(name, TRUTH, options)
        self.reference = create_policy(name, TRUTH, options)
        self.reference.memoise_refusals = False
        self.compared = self.passed_over = 0

    def decide(self, state):
        reference = self.reference.decide(state)
        decision = self.inner.decide(state)
        assert decision.actions == reference.actions, state.now
        self.compared += bool(decision.actions)
        self.passed_over += len(state.queue) - len(decision.actions)
        return decision


def test_marble_refusal_memo_decides_as_a_full_rescan():
    # Congested (load 2) with a job-size mix, so a blocked head holds a reservation and hundreds
    # of jobs of a few kinds are passed over behind it: the memo answers most of them.
    spec = ClusterSpec(4, 6)
    jobs = WorkloadSource("synthetic:200@2/1:4,2:2,4:1,8:1").load(TRUTH, 5, spec)
    for name in ("marble-fifo", "marble-elastic"):
        policy = Compared(name, PolicyOptions(backfill_depth=100))
        Simulator(spec, policy, TRUTH, jobs, restart_cost=30.0).run()
        assert policy.compared > 100 and policy.passed_over > 3_000, (name, policy.compared, policy.passed_over)


def test_marble_las_index_decides_as_a_fresh_rebuild():
    # marble-las keeps tiresias' priority index across decisions; a fresh policy per decision
    # builds it from the state alone. Starts and preemptions must match at every decision (grows
    # are left out: they come from the set of jobs started small, which only the long-lived one has).
    from mlsyskit.tools.sched.state import Resize

    opts = PolicyOptions(tiresias_thresholds=(600.0, 6000.0))

    class Checked:
        name = "marble-las-checked"

        def __init__(self):
            self.inner, self.compared = create_policy("marble-las", TRUTH, opts), 0

        def decide(self, state):
            reference = create_policy("marble-las", TRUTH, opts).decide(state)
            decision = self.inner.decide(state)
            assert [a for a in decision.actions if not isinstance(a, Resize)] == list(reference.actions), state.now
            self.compared += bool(reference.actions)
            return decision

    spec = ClusterSpec(4, 6)
    jobs = WorkloadSource("synthetic:300@1.5/1:4,2:2,4:1,8:1").load(TRUTH, 3, spec)
    policy = Checked()
    result = Simulator(spec, policy, TRUTH, jobs, restart_cost=30.0).run()
    assert policy.compared > 100 and result.counters["preemptions"] > 10
