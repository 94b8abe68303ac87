"""The replay's shortcuts are for speed only: marble's share of spare GPUs without ranking when
they cover every ladder, its set of grown jobs kept up incrementally, and pollux's rows of goodput
per GPU count (read directly by its greedy's gains) decide exactly as the plain code paths (same finish times, restarts and batches)."""
from mlsyskit.tools.sched.cluster import ClusterSpec
from mlsyskit.tools.sched.experiment import WorkloadSource, policy_model
from mlsyskit.tools.sched.policies import create_policy
from mlsyskit.tools.sched.policies.marble import Marble
from mlsyskit.tools.sched.policies.optimus import Optimus
from mlsyskit.tools.sched.policies.pollux import Pollux
from mlsyskit.tools.sched.simulator import Simulator
from mlsyskit.tools.sched.throughput import ThroughputModel

TRUTH = ThroughputModel()


def _replay(policy: str, workload: str, cluster: str) -> dict:
    spec = ClusterSpec.parse(cluster)
    jobs = WorkloadSource(workload).load(TRUTH, 1, spec)
    learned = policy_model(TRUTH, seed=1)
    result = Simulator(spec, create_policy(policy, learned), TRUTH, jobs, restart_cost=30.0, seed=1,
                       samples=learned.samples).run()
    assert result.counters["rebatches"] > 0 and result.counters["resizes"] > 0
    return {r.spec.job_id: (result.finish[r.spec.job_id], r.restarts, r.batch) for r in result.jobs}


def test_marble_shortcuts_decide_as_the_plain_paths(monkeypatch):
    covered, plain_covers = [], Marble._covers
    monkeypatch.setattr(Marble, "_covers", staticmethod(lambda *a: covered.append(plain_covers(*a)) or covered[-1]))
    fast = _replay("marble-admit", "workload-2", "16x4")   # with preemptions: grown jobs leave by both ways
    assert covered.count(True) > 20 and covered.count(False) > 0, (covered.count(True), covered.count(False))

    plain_sync = Marble._sync

    def checked_sync(self, state):   # the incremental set of grown jobs holds running jobs only
        plain_sync(self, state)
        assert self._grown <= state.running.keys()

    monkeypatch.setattr(Marble, "_covers", staticmethod(lambda *a: False))
    monkeypatch.setattr(Marble, "_sync", checked_sync)
    assert _replay("marble-admit", "workload-2", "16x4") == fast


def test_pollux_rows_decide_as_plain_rates(monkeypatch):
    reads = []
    rows = Pollux._rates

    def counted(self, job, gpn):
        rate = rows(self, job, gpn)
        return lambda gpus: reads.append(gpus) or rate(gpus)

    monkeypatch.setattr(Pollux, "_rates", counted)
    fast = _replay("pollux", "workload-2", "16x4")
    assert len(reads) > 1000
    monkeypatch.setattr(Pollux, "_rates", Optimus._rates)   # every read through _rate and the memo
    monkeypatch.setattr(Pollux, "_gain", Optimus._gain)     # no kept goodputs read directly
    assert _replay("pollux", "workload-2", "16x4") == fast
