"""marble's shortcuts are for speed only: kept envelope steps (MarbleGoodput._envelope_step), the
fast path that answers a step from them, the greedy's ends read off each job's own steps
(_chain_ends), kept goodputs read directly in scans, and the learned model's kept corrections.
A replay decides exactly as with every step scanned afresh through rate() and every estimate
recomputed (same finish times, restarts and batches), on a cluster whose node size puts a dip in
the curves (16x6) and on one without (16x4)."""
import pytest

from mlsyskit.tools.sched.cluster import ClusterSpec
from mlsyskit.tools.sched.experiment import WorkloadSource, policy_model
from mlsyskit.tools.sched.policies import create_policy
from mlsyskit.tools.sched.policies.learned import LearnedModel
from mlsyskit.tools.sched.policies.marble_goodput import MarbleGoodput
from mlsyskit.tools.sched.simulator import Simulator
from mlsyskit.tools.sched.throughput import ThroughputModel

TRUTH = ThroughputModel()


def _replay(workload: str, cluster: str) -> dict:
    spec = ClusterSpec.parse(cluster)
    jobs = WorkloadSource(workload).load(TRUTH, 1, spec)
    learned = policy_model(TRUTH, seed=1)
    result = Simulator(spec, create_policy("marble", learned), TRUTH, jobs, restart_cost=30.0, seed=1,
                       samples=learned.samples).run()
    assert result.counters["resizes"] > 0
    return {r.spec.job_id: (result.finish[r.spec.job_id], r.restarts, r.batch) for r in result.jobs}


class _Forgetful(dict):
    """A table that keeps nothing: every estimate recomputed."""

    def __setitem__(self, key, value) -> None:
        pass


@pytest.mark.parametrize("workload, cluster", [("workload-2", "16x4"), ("workload-3", "16x6")])
def test_shortcuts_decide_as_fresh_scans(monkeypatch, workload, cluster):
    used = {"steps": 0, "ends": 0}
    kept, scan, chain_ends = MarbleGoodput._envelope_step, MarbleGoodput._scan, MarbleGoodput._chain_ends

    def counted_step(*a):
        used["steps"] += 1
        return kept(*a)

    def counted_ends(*a):
        found = chain_ends(*a)
        used["ends"] += found is not None
        return found

    monkeypatch.setattr(MarbleGoodput, "_envelope_step", counted_step)
    monkeypatch.setattr(MarbleGoodput, "_chain_ends", counted_ends)
    fast = _replay(workload, cluster)
    assert used["ends"] > 10, used

    def fresh(self, curve, rate, k, hi):   # the plain scan at every step, every read through rate()
        used["fresh"] += 1
        return scan(rate, curve[5], curve[5] / rate(k), k, hi)

    init = LearnedModel.__init__

    def forgetful_init(self, *a, **kw):
        init(self, *a, **kw)
        self._factors = _Forgetful()

    monkeypatch.setattr(MarbleGoodput, "_envelope_step", fresh)
    monkeypatch.setattr(MarbleGoodput, "_view", lambda self, curve: (None, {}, None))
    monkeypatch.setattr(MarbleGoodput, "_chain_ends", lambda *a: None)
    monkeypatch.setattr(LearnedModel, "__init__", forgetful_init)
    used["fresh"] = 0
    assert _replay(workload, cluster) == fast
    assert used["steps"] + 100 < used["fresh"], used   # steps answered without a call
