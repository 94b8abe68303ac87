"""The daemon feeds the running jobs' measured throughput to its policy's online model, as the simulator does."""
import pytest

from mlsyskit.tools.sched.daemon import adapter
from mlsyskit.tools.sched.daemon.jobstore import Job
from mlsyskit.tools.sched.daemon.progress import Progress
from mlsyskit.tools.sched.daemon.runner import online_model
from mlsyskit.tools.sched.daemon.specs import ClusterConfig, JobRequest, NodeConfig
from mlsyskit.tools.sched.policies import create_policy
from mlsyskit.tools.sched.policies.learned import LearnedModel
from mlsyskit.tools.sched.throughput import ThroughputModel

MODEL = ThroughputModel()
CLUSTER = ClusterConfig((NodeConfig("n0", 4, logical=True), NodeConfig("n1", 4, logical=True)))


def _running(job_id, restarts=0, started=1000.0):
    return Job(job_id, f"j{job_id}", JobRequest(cmd="x", app="cifar10", gpus=2, batch_size=256), "running", 0.0,
               started, None, ((0, 2),), (2,), {0: (0, 1)}, "h", None, "", "/tmp/x", restarts=restarts)


def _queued(job_id):
    return Job(job_id, f"j{job_id}", JobRequest(cmd="x", app="cifar10", gpus=2, batch_size=256), "queued", 0.0,
               None, None, (), (), {}, None, None, "", None)


def test_reported_rates_reach_the_policys_model_once_per_run():
    policy = create_policy("marble", online_model(MODEL))
    learned = policy.model
    assert isinstance(learned, LearnedModel)
    measured = adapter.Measurements.of(policy)
    assert measured.samples is learned.samples
    prior = learned.rate("cifar10", (2,), 256)
    slow = prior / 3                                       # the cluster runs it at a third of the model's rate
    report = Progress(1000.0, 0.0, 1100.0, slow * 100.0, ())
    jobs = [_running(1), _queued(2)]
    adapter.plan(policy, CLUSTER, jobs, MODEL, 1110.0, {1: report}, measured=measured)
    assert learned.samples == [("cifar10", (2,), 256, pytest.approx(slow))]
    assert learned.rate("cifar10", (2,), 256) == pytest.approx(slow)   # the model moved to the measurement
    adapter.plan(policy, CLUSTER, jobs, MODEL, 1120.0, {1: report}, measured=measured)
    assert len(learned.samples) == 1                      # the same run is fed once
    rerun = [_running(1, restarts=1, started=2000.0)]
    assert measured.feed(rerun, {1: report}, MODEL) == 0   # a report from before this run is not its rate
    assert measured.feed(rerun, {1: Progress(2000.0, 0.0, 2010.0, slow * 10.0, ())}, MODEL) == 1
    assert len(learned.samples) == 2


def test_no_rate_no_sample_and_a_policy_without_an_online_model_is_left_alone():
    policy = create_policy("fifo", MODEL)
    measured = adapter.Measurements.of(policy)
    one_point = Progress(1000.0, 5.0, 1000.0, 5.0, ())
    assert measured.feed([_running(1)], {1: one_point}, MODEL) == 0
    assert measured.feed([_running(1)], {}, MODEL) == 0
    assert measured.feed([_queued(3)], {3: Progress(0.0, 0.0, 10.0, 10.0, ())}, MODEL) == 0
    assert measured.feed([_running(1)], {1: Progress(1000.0, 0.0, 1010.0, 100.0, ())}, MODEL) == 1
    assert not hasattr(MODEL, "samples")
