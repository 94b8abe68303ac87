"""marble's kept envelope steps (MarbleGoodput._envelope_step) are for speed only: a replay decides
exactly as with every step scanned afresh (same finish times, restarts and batches), on a cluster
whose node size puts a dip in the curves (16x6) and on one without (16x4)."""
import pytest

from mlsyskit.tools.sched.cluster import ClusterSpec
from mlsyskit.tools.sched.experiment import WorkloadSource, policy_model
from mlsyskit.tools.sched.policies import create_policy
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


@pytest.mark.parametrize("workload, cluster", [("workload-2", "16x4"), ("workload-3", "16x6")])
def test_kept_envelope_steps_decide_as_fresh_scans(monkeypatch, workload, cluster):
    kept, scan, steps, scans = MarbleGoodput._envelope_step, MarbleGoodput._scan, [], []
    monkeypatch.setattr(MarbleGoodput, "_envelope_step", lambda *a: steps.append(1) or kept(*a))
    monkeypatch.setattr(MarbleGoodput, "_scan", staticmethod(lambda *a: scans.append(1) or scan(*a)))
    fast = _replay(workload, cluster)
    assert len(steps) - len(scans) > 100, (len(steps), len(scans))   # steps answered from the cache

    def fresh(self, curve, rate, k, hi):   # the plain scan at every step
        return self._scan(rate, curve[5], curve[5] / rate(k), k, hi)

    monkeypatch.setattr(MarbleGoodput, "_envelope_step", fresh)
    assert _replay(workload, cluster) == fast
