"""Policies see what a real scheduler sees: never the true work, true rate or the simulator's model."""
import ast
import dataclasses
import inspect
import random

import pytest

from mlsyskit.tools.sched import ground_truth
from mlsyskit.tools.sched.cluster import ClusterSpec
from mlsyskit.tools.sched.experiment import WorkloadSource, run_one
from mlsyskit.tools.sched.ground_truth import ModelWithError, loss_curve, noisy_loss
from mlsyskit.tools.sched.policies import POLICIES, PolicyOptions, create_policy, loss_fit
from mlsyskit.tools.sched.simulator import Simulator
from mlsyskit.tools.sched.state import ClusterState, Decision, JobSpec, JobView, Start
from mlsyskit.tools.sched.throughput import ThroughputModel

TRUTH = ThroughputModel()
SPEC = ClusterSpec(16, 6)


def test_the_observation_has_no_ground_truth_fields():
    view = JobView(1, "j", "bert", 0.0, 4, 384)
    for name in ("work", "spec", "rate", "done", "remaining", "end"):
        assert not hasattr(view, name), name
    with pytest.raises(AttributeError):
        view.work = 1.0   # __slots__: nothing can be attached by accident
    fields = {f.name for f in dataclasses.fields(ClusterState)}
    assert fields == {"spec", "free", "now", "queue", "running", "by_end", "restart_cost", "history", "arrived",
                      "finished"}


@pytest.mark.parametrize("module", ["base", "common", "fifo", "backfill", "marble", "marble_elastic", "optimus",
                                    "tiresias", "loss_fit"])
def test_policy_code_does_not_import_the_truth(module):
    tree = ast.parse(inspect.getsource(__import__(f"mlsyskit.tools.sched.policies.{module}", fromlist=["x"])))
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
    attributes = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    assert not {m for m in imported if m and m.rsplit(".", 1)[-1] in ("ground_truth", "simulator", "workloads")}
    assert "JobRecord" not in names and not attributes & {"work", "spec_work", "records", "curves", "truth"}


class Enough(Exception):
    """Raised to end a replay once its observations could differ from the other's."""


class Recorder:
    """Wraps a policy; records its decisions until the observation could differ between two
    truths: the first finished job (history) or a third loss report on any job (optimus' fit)."""

    def __init__(self, policy):
        self.policy, self.name, self.log = policy, policy.name, []
        if hasattr(policy, "wants_loss_reports"):
            self.wants_loss_reports = policy.wants_loss_reports

    def decide(self, state):
        if state.history.by_app or any(len(j.loss_reports) >= loss_fit.MIN_REPORTS for j in state.running.values()):
            raise Enough
        decision = self.policy.decide(state)
        self.log.append((state.now, decision))
        return decision


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_a_perturbed_truth_gives_the_same_decisions(name):
    # Long jobs (x50), so that many arrivals and decisions come before the first job finishes.
    jobs = [dataclasses.replace(j, work=j.work * 50) for j in WorkloadSource("workload-1").load(TRUTH, 0, SPEC)]
    rng = random.Random(5)
    other = [dataclasses.replace(j, work=j.work * rng.uniform(0.3, 3.0)) for j in jobs]
    logs = []
    for trace in (jobs, other):
        rec = Recorder(create_policy(name, TRUTH, PolicyOptions()))
        with pytest.raises(Enough):
            Simulator(SPEC, rec, TRUTH, trace, restart_cost=30.0, seed=0).run()
        logs.append(rec.log)
    n = min(len(logs[0]), len(logs[1]))
    assert n >= 5 and sum(len(d.actions) for _, d in logs[0][:n]) >= 5
    assert logs[0][:n] == logs[1][:n]


class Peeking:
    """A policy that cheats: it starts the waiting job with the least true work first."""

    name = "peeking"

    def __init__(self, trace):
        self.work = {j.job_id: j.work for j in trace}

    def decide(self, state):
        if not state.queue or state.free.total == 0:
            return Decision()
        job = min(state.queue.values(), key=lambda j: self.work[j.job_id])
        placement = state.free.spread(job.gpus)
        return Decision((Start(job.job_id, placement),) if placement else ())


def test_the_comparison_catches_a_policy_that_reads_the_truth():
    small = ClusterSpec(1, 6)   # eight 6-GPU jobs arrive together: seven wait
    jobs = [JobSpec(i, f"j{i}", "bert", 0.0, 6, 384, 1e6 * (i + 1)) for i in range(8)]
    other = [dataclasses.replace(j, work=1e6 * (8 - j.job_id)) for j in jobs]   # the sizes reversed
    logs = []
    for trace in (jobs, other):
        rec = Recorder(Peeking(trace))
        with pytest.raises(Enough):
            Simulator(small, rec, TRUTH, trace, restart_cost=30.0, seed=0).run()
        logs.append(rec.log)
    assert logs[0][0] != logs[1][0]


def test_loss_fit_recovers_total_work_from_the_first_half():
    errors = []
    for i in range(20):
        job = JobSpec(i, f"job-{i}", "bert", 0.0, 1, 384, work=random.Random(i).uniform(1e5, 1e8))
        curve = loss_curve(3, job)
        points = [(job.work * f, noisy_loss(3, job, curve, job.work * f, n))
                  for n, f in enumerate((0.05, 0.1, 0.2, 0.3, 0.4, 0.5))]
        estimate = loss_fit.total_work(points, curve.target)
        errors.append(abs(estimate - job.work) / job.work if estimate else 1.0)
    errors.sort()
    assert errors[10] < 0.25, errors          # median error after half the training
    assert loss_fit.total_work(points[:2], curve.target) is None   # too few reports to say


def test_model_with_error_has_about_the_error_asked_and_none_at_zero():
    for error in (0.1, 0.25):
        fitted = ModelWithError(TRUTH, error, seed=1)
        rel = [abs(fitted.rate(app, (g,), b) / TRUTH.rate(app, (g,), b) - 1)
               for app, batches in (("bert", (384,)), ("cifar10", (2048, 4096)), ("imagenet", (3200,)),
                                    ("ncf", (32768,)), ("yolov3", (64,)), ("deepspeech2", (320,)))
               for b in batches for g in range(1, 7)]
        assert 0.4 * error < sum(rel) / len(rel) < 2.0 * error
    exact = ModelWithError(TRUTH, 0.0, seed=1)
    assert exact.rate("bert", (4,), 384) == TRUTH.rate("bert", (4,), 384)
    with pytest.raises(ValueError):
        ModelWithError(TRUTH, float("nan"))


def test_model_error_moves_results_but_every_job_finishes():
    source = WorkloadSource("workload-1")
    runs = {e: run_one(source, SPEC, "marble", 0, TRUTH, PolicyOptions(), 30.0, model_error=e) for e in (0.0, 0.25)}
    assert runs[0.0].summary["jobs"] == runs[0.25].summary["jobs"] == 160
    assert runs[0.0].summary["avg_jct_s"] != runs[0.25].summary["avg_jct_s"]
    assert ground_truth.LOSS_NOISE > 0
