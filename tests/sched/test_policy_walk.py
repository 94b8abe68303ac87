"""The LAS policies' admission walk takes runs of running jobs in one step (policies.running_order:
prefix sums of what each keeps). It must decide exactly as the plain walk over the merged order,
one job at a time, at every decision of congested replays with preemptions, queue crossings,
resizes and a small backfill depth (so the depth rule and a used-up capacity both end walks)."""
import heapq

import pytest

from mlsyskit.tools.sched.cluster import ClusterSpec
from mlsyskit.tools.sched.experiment import WorkloadSource
from mlsyskit.tools.sched.policies import PolicyOptions
from mlsyskit.tools.sched.policies.marble import Marble
from mlsyskit.tools.sched.policies.marble_las import MarbleLas
from mlsyskit.tools.sched.policies.running_order import RunningOrder
from mlsyskit.tools.sched.policies.tiresias import Tiresias
from mlsyskit.tools.sched.simulator import Simulator
from mlsyskit.tools.sched.throughput import ThroughputModel

TRUTH = ThroughputModel()
OPTS = PolicyOptions(tiresias_thresholds=(300.0, 3000.0), marble_thresholds=(300.0, 3000.0), backfill_depth=3,
                     starvation_s=2 * 3600.0)


class PlainWalk:
    """The walk one job at a time over heapq.merge of both orders (what the bulk walk replaced)."""

    def _walk(self, state, capacity):
        admitted, keep = [], set()
        misses = seen = 0
        for _, _, job_id in heapq.merge(self._waiting, list(self._running)):
            if capacity <= 0:
                break
            job = state.running.get(job_id)
            if job is not None:
                seen += 1
                gpus = self.holds(state, job)
                if gpus <= capacity:
                    capacity -= gpus
                    keep.add(job_id)
                    continue
            else:
                job = state.queue[job_id]
                gpus = self.grant(state, job, capacity)
                if gpus:
                    capacity -= gpus
                    admitted.append((job, gpus))
                    continue
            misses += 1
            if misses > self.options.backfill_depth and seen == len(state.running):
                break
        return admitted, [i for i in state.running if i not in keep]


class Compared:
    def __init__(self, cls):
        self.name = f"{cls.name}-compared"
        self.inner = cls(TRUTH, OPTS)
        self.reference = type("Plain", (PlainWalk, cls), {})(TRUTH, OPTS)
        self.preempting = 0

    def decide(self, state):
        reference = self.reference.decide(state)
        decision = self.inner.decide(state)
        assert decision == reference, state.now
        self.preempting += any(type(a).__name__ == "Preempt" for a in decision.actions)
        return decision


@pytest.mark.parametrize("cls", [Tiresias, MarbleLas, Marble])
def test_bulk_walk_decides_as_the_plain_walk(cls):
    spec = ClusterSpec(4, 6)
    jobs = WorkloadSource("synthetic:200@3/1:70,2:10,4:10,8:8~heavy").load(TRUTH, 3, spec)   # Philly-like
    policy = Compared(cls)
    result = Simulator(spec, policy, TRUTH, jobs, restart_cost=30.0).run()
    assert policy.preempting > 50 and result.counters["preemptions"] > 100, (policy.preempting, result.counters)
    if cls is Marble:
        assert result.counters["resizes"] > 20, result.counters


def test_running_order_sums_follow_changes():
    held = {1: 2, 2: 3, 3: 1, 4: 4}
    order = RunningOrder(held.__getitem__)
    for key in [(0, 5.0, 1), (1, 1.0, 2), (0, 1.0, 3)]:
        order.add(key)
    assert order.keys == [(0, 1.0, 3), (0, 5.0, 1), (1, 1.0, 2)]
    assert order.prefix(3) == [0, 1, 3, 6]
    order.add((0, 3.0, 4))            # inserted at position 1: the sums from there are recomputed
    assert order.prefix(4) == [0, 1, 5, 7, 10]
    held[1] = 6
    order.touch((0, 5.0, 1))          # resized: its remembered hold is dropped
    assert order.prefix(4) == [0, 1, 5, 11, 14]
    order.discard((0, 1.0, 3))
    order.discard((9, 9.0, 9))        # not there: nothing changes
    assert order.prefix(3) == [0, 4, 10, 13] and (0, 1.0, 3) not in order and (0, 3.0, 4) in order


def test_walk_asks_what_a_running_job_keeps_once_per_change():
    # The cost the bulk walk removes: the plain walk asked every running job what it keeps in
    # every decision. Here `holds` is asked again only after a start, crossing or resize.
    class Counted(Tiresias):
        asked = walked = 0

        def holds(self, state, job):
            Counted.asked += 1
            return super().holds(state, job)

        def _walk(self, state, capacity):
            Counted.walked += len(state.running)
            return super()._walk(state, capacity)

    spec = ClusterSpec(8, 8)
    jobs = WorkloadSource("synthetic:400@1.2/1:70,2:10,4:10,8:8~heavy").load(TRUTH, 4, spec)
    result = Simulator(spec, Counted(TRUTH, OPTS), TRUTH, jobs, restart_cost=30.0).run()
    assert Counted.walked > 5_000, Counted.walked   # running jobs the plain walk would have visited
    assert Counted.asked <= result.counters["starts"] * 3, (Counted.asked, result.counters)
    assert Counted.asked < Counted.walked / 4, (Counted.asked, Counted.walked)
