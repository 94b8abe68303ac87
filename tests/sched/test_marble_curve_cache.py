"""marble's curve caches (per-job curve, layouts shared across noise-scale buckets, an application's
early bucket) are for speed only: a replay decides exactly as without them, and a cached layout
follows the learned model's estimates."""
from mlsyskit.tools.sched.cluster import ClusterSpec
from mlsyskit.tools.sched.experiment import WorkloadSource, policy_model
from mlsyskit.tools.sched.policies import goodput
from mlsyskit.tools.sched.policies.marble import Marble
from mlsyskit.tools.sched.policies.sizing import layouts
from mlsyskit.tools.sched.simulator import Simulator
from mlsyskit.tools.sched.throughput import ThroughputModel

TRUTH = ThroughputModel()
SPEC = ClusterSpec.parse("16x4")


def _replay() -> dict:
    jobs = WorkloadSource("workload-1").load(TRUTH, 1, SPEC)
    learned = policy_model(TRUTH, seed=1)
    sim = Simulator(SPEC, Marble(learned), TRUTH, jobs, restart_cost=30.0, seed=1, samples=learned.samples)
    result = sim.run()
    assert result.counters["rebatches"] > 0   # the lever is in play
    return {r.spec.job_id: (result.finish[r.spec.job_id], r.restarts, r.batch) for r in result.jobs}


def test_a_replay_decides_the_same_without_the_caches(monkeypatch):
    cached = _replay()
    plain_curve = Marble.curve

    def uncached_curve(self, state, job):
        self._job_curve.clear()
        return plain_curve(self, state, job)

    monkeypatch.setattr(Marble, "curve", uncached_curve)
    monkeypatch.setattr(goodput, "_layouts", lambda model, app, submitted, most, gpn, memo:
                        layouts(model, app, submitted, most, gpn))
    assert _replay() == cached


def test_cached_layouts_follow_the_learned_model():
    model, memo = policy_model(TRUTH, seed=0), {}
    first = goodput._layouts(model, "imagenet", 800, 8, 4, memo)
    assert first == layouts(model, "imagenet", 800, 8, 4)
    assert goodput._layouts(model, "imagenet", 800, 8, 4, memo) == first
    model.samples.append(("imagenet", (4, 4), 800, 3.0 * model.rate("imagenet", (4, 4), 800)))
    moved = goodput._layouts(model, "imagenet", 800, 8, 4, memo)   # takes the sample in, as rate() would
    assert moved == layouts(model, "imagenet", 800, 8, 4)
    assert moved[1] != first[1]
