"""Statistical efficiency (Pollux's batch-size lever): the truth the simulator keeps, what a policy
sees of it, and marble's use of it."""
import dataclasses
import math

import pytest

from mlsyskit.tools.sched import ground_truth
from mlsyskit.tools.sched.cluster import ClusterSpec
from mlsyskit.tools.sched.efficiency import batch_choices, gain
from mlsyskit.tools.sched.experiment import WorkloadSource, policy_model
from mlsyskit.tools.sched.ground_truth import SEGMENTS, noise_scale_segments
from mlsyskit.tools.sched.policies import PolicyOptions, create_policy
from mlsyskit.tools.sched.simulator import Simulator
from mlsyskit.tools.sched.state import Decision, JobRecord, JobSpec, Start
from mlsyskit.tools.sched.throughput import ThroughputModel

TRUTH = ThroughputModel()


def test_gain_is_relative_to_the_submitted_batch():
    assert gain(1000.0, 800, 800) == 1.0
    assert gain(1000.0, 800, 200) > 1.0 > gain(1000.0, 800, 3200)
    assert gain(1e12, 800, 3200) == pytest.approx(1.0)   # a huge noise scale: batches are free
    assert batch_choices("imagenet", 6400, 8) == (200, 400, 800, 1600, 3200, 6400)
    assert batch_choices("imagenet", 6400, 32) == (800, 1600, 3200, 6400)   # >= 20 samples per GPU
    assert batch_choices("lin", 64, 1) == (64,)   # no known range: the submitted batch only


def test_noise_scale_grows_with_training_and_differs_per_job():
    a, b = noise_scale_segments(0, "a", "imagenet"), noise_scale_segments(0, "b", "imagenet")
    assert len(a) == SEGMENTS and list(a) == sorted(a) and a != b
    assert a[0] / b[0] == pytest.approx(a[-1] / b[-1])   # one factor per job on the app's trajectory
    assert noise_scale_segments(0, "a", "lin") == ()


def test_progress_walks_the_slices_of_work():
    spec = JobSpec(0, "j", "imagenet", 0.0, 4, 6400, 8e6)
    rec = JobRecord(spec, placement=((0, 4),), rate=1000.0, batch=800,
                    gains=tuple(gain(p, 6400, 800) for p in noise_scale_segments(0, "j", "imagenet")))
    t = rec.seconds_left()
    assert rec.done_at(t) == pytest.approx(spec.work)
    # the first slice at its own gain, then the rest
    first = spec.work / SEGMENTS / (1000.0 * rec.gains[0])
    assert rec.done_at(first) == pytest.approx(spec.work / SEGMENTS)
    assert rec.done_at(first / 2) == pytest.approx(spec.work / SEGMENTS / 2)
    plain = dataclasses.replace(rec, gains=())
    assert plain.seconds_left() == pytest.approx(spec.work / 1000.0) and plain.done_at(10.0) == 1e4


class Fixed:
    """Starts every waiting job on one node's GPUs with a given global batch."""

    name = "fixed"

    def __init__(self, batch):
        self.batch = batch

    def decide(self, state):
        for job in state.queue.values():
            placement = state.free.fit((job.gpus,))
            if placement:
                return Decision((Start(job.job_id, placement, None, self.batch),))
        return Decision()


def _alone(batch):
    job = JobSpec(0, "im", "imagenet", 0.0, 4, 6400, 2e7)
    return Simulator(ClusterSpec(1, 4), Fixed(batch), TRUTH, [job], seed=3).run().finish[0]


def test_a_smaller_batch_trades_throughput_for_efficiency():
    submitted, same = _alone(None), _alone(6400)
    assert submitted == same == pytest.approx(2e7 / TRUTH.rate("imagenet", (4,), 6400))
    smaller = _alone(800)
    phis = noise_scale_segments(3, "im", "imagenet")
    rate = TRUTH.rate("imagenet", (4,), 800)
    expected = sum(2e7 / SEGMENTS / (rate * gain(p, 6400, 800)) for p in phis)
    assert smaller == pytest.approx(expected) and smaller != pytest.approx(submitted, rel=0.01)


def _workload(n=24):
    jobs = WorkloadSource("workload-2").load(TRUTH, 1, ClusterSpec(4, 4))[:n]
    return [dataclasses.replace(j, gpus=min(j.gpus, 16)) for j in jobs]


@pytest.mark.parametrize("name", ["marble", "marble-admit"])
def test_marble_sees_measured_noise_scales_only_and_changes_batches(name):
    sim = Simulator(ClusterSpec(4, 4), create_policy(name, policy_model(TRUTH, 0.1, 0), PolicyOptions()), TRUTH,
                    _workload(), seed=1)
    seen = []
    decide = sim.policy.decide

    def spy(state):
        seen.extend((j.job_id, j.noise_scale) for j in state.running.values() if j.noise_scale > 0)
        return decide(state)

    sim.policy.decide = spy
    result = sim.run()
    assert len(result.finish) == len(sim.jobs) and seen
    truth = {j.job_id: set(sim._phis.get(j.job_id, ())) for j in sim.jobs}
    # a measurement is the truth of some slice times a log-normal error, never the truth itself
    assert all(phi not in truth[i] for i, phi in seen)
    assert all(min(abs(math.log(phi / t)) for t in truth[i]) < 5 * ground_truth.MEASURE_NOISE for i, phi in seen)
    batches = {r.batch for r in result.jobs} - {r.spec.batch_size for r in result.jobs}
    # marble sets every job's batch at its (re-)allocations; in this short replay none moved in place
    assert batches and (name == "marble" or result.counters["rebatches"] > 0)


def test_baselines_keep_the_submitted_batch_and_see_no_noise_scale():
    for name in ("tiresias", "optimus"):
        sim = Simulator(ClusterSpec(4, 4), create_policy(name, policy_model(TRUTH, 0.1, 0), PolicyOptions()), TRUTH,
                        _workload(12), seed=1)
        result = sim.run()
        assert all(r.batch == r.spec.batch_size and not r.gains for r in result.jobs)
        assert not sim.state.noise_reports and all(v.noise_scale == 0.0 for v in sim.views.values())


def test_marble_without_the_batch_lever_keeps_every_batch():
    opts = PolicyOptions(adapt_batch=False)
    sim = Simulator(ClusterSpec(4, 4), create_policy("marble", policy_model(TRUTH, 0.1, 0), opts), TRUTH,
                    _workload(12), seed=1)
    result = sim.run()
    assert all(r.batch == r.spec.batch_size for r in result.jobs) and result.counters["rebatches"] == 0
