"""The daemon's scheduling loop without processes or network: a fake executor, a virtual clock."""
import random
from pathlib import Path

import pytest

from mlsyskit.core.clock import VirtualClock
from mlsyskit.core.config import ConfigError
from mlsyskit.core.errors import UsageError
from mlsyskit.tools.sched.daemon.jobstore import JobStore
from mlsyskit.tools.sched.daemon.runner import daemon_model
from mlsyskit.tools.sched.daemon.scheduler import Scheduler
from mlsyskit.tools.sched.daemon.specs import (
    ClusterConfig,
    JobRequest,
    NodeConfig,
    job_from_mapping,
    load_cluster,
)
from mlsyskit.tools.sched.executors.base import EXITED, GONE, RUNNING, Executor, ExecutorError, Status
from mlsyskit.tools.sched.policies import POLICIES, create_policy
from mlsyskit.tools.sched.throughput import ThroughputModel

MODEL = ThroughputModel()


class FakeExecutor(Executor):
    name = "fake"
    one_machine = True

    def __init__(self) -> None:
        self.launched: list[int] = []
        self.status: dict[str, Status] = {}
        self.signals: list[tuple[int, bool]] = []
        self.recoverable: dict[int, str | None] = {}
        self.refuse = False

    def launch(self, launch):
        if self.refuse:
            raise ExecutorError("no such partition")
        self.launched.append(launch.job_id)
        handle = f"h{launch.job_id}"
        self.status[handle] = Status(RUNNING)
        return handle

    def poll(self, launch, handle):
        return self.status[handle]

    def recover(self, launch):
        return self.recoverable.get(launch.job_id)

    def cancel(self, launch, handle, force):
        self.signals.append((launch.job_id, force))
        if force:
            self.status[handle] = Status(GONE, reason="killed")


def make(tmp_path, executor=None, nodes=2, gpus=4, policy="marble", store=None, model=MODEL):
    cluster = ClusterConfig(tuple(NodeConfig(f"n{i}", gpus, logical=True) for i in range(nodes)))
    clock = VirtualClock(1000.0)
    ex = executor or FakeExecutor()
    sched = Scheduler(cluster, store or JobStore(tmp_path / "jobs.db"), ex, create_policy(policy, model), model,
                      clock, tmp_path, cancel_grace_s=10.0)
    return sched, ex, clock


def job(gpus=2, app="ncf", **kw) -> JobRequest:
    return JobRequest(cmd="true", app=app, gpus=gpus, **kw)


def held_sets(sched) -> list[tuple[int, int]]:
    return [(node, d) for j in sched.store.jobs(("launching", "running", "cancelling")) for node, ids in j.gpus.items()
            for d in ids]


def test_no_gpu_is_ever_held_twice_under_random_arrivals_and_ends(tmp_path):
    rng = random.Random(7)
    sched, ex, clock = make(tmp_path, nodes=3, gpus=4)
    apps = MODEL.apps
    for _ in range(300):
        for _ in range(rng.randrange(3)):
            sched.submit(job(gpus=rng.randint(1, 8), app=rng.choice(apps), min_gpus=1))
        running = [h for h, s in ex.status.items() if s.kind == RUNNING]
        for handle in rng.sample(running, k=min(len(running), rng.randrange(3))):
            ex.status[handle] = Status(EXITED, exit_code=rng.choice([0, 0, 1]))
        clock.advance(rng.uniform(0, 30))
        sched.step()
        held = held_sets(sched)
        assert len(held) == len(set(held)), "a device id is held by two jobs"
        for node in range(3):
            assert sum(1 for n, _ in held if n == node) <= 4
    assert len(ex.launched) == len(set(ex.launched)), "a job was launched twice"
    states = {j.state for j in sched.store.jobs()}
    assert states <= {"queued", "running", "done", "failed"}


def test_a_launch_cut_short_by_a_crash_is_queued_again_and_runs_once(tmp_path):
    sched, ex, clock = make(tmp_path)
    first = sched.submit(job())
    # the crash: the store says launching, the executor never ran it
    assert sched.store.mark_launching(first.id, ((0, 2),), (2,), {0: (0, 1)}, str(tmp_path / "jobs/1"), clock.now())
    restarted, ex2, _ = make(tmp_path, store=sched.store)
    restarted.recover()
    assert restarted.store.get(first.id).state == "queued" and "daemon restart" in restarted.store.get(first.id).reason
    restarted.step()
    assert ex2.launched == [first.id] and restarted.store.get(first.id).state == "running"


def test_a_launch_that_did_start_is_reattached_not_relaunched(tmp_path):
    sched, ex, clock = make(tmp_path)
    first = sched.submit(job())
    sched.store.mark_launching(first.id, ((0, 2),), (2,), {0: (0, 1)}, str(tmp_path / "jobs/1"), clock.now())
    ex2 = FakeExecutor()
    ex2.recoverable[first.id] = "h1"
    ex2.status["h1"] = Status(RUNNING)
    restarted, _, _ = make(tmp_path, executor=ex2, store=sched.store)
    restarted.recover()
    restarted.step()
    assert ex2.launched == [] and restarted.store.get(first.id).state == "running"
    ex2.status["h1"] = Status(EXITED, exit_code=0)
    restarted.step()
    assert restarted.store.get(first.id).state == "done"


def test_cancel_escalates_to_kill_after_the_grace_period(tmp_path):
    sched, ex, clock = make(tmp_path)
    a = sched.submit(job())
    sched.step()
    sched.cancel(a.id)
    assert ex.signals == [(a.id, False)] and sched.store.get(a.id).state == "cancelling"
    clock.advance(5)
    sched.step()
    assert ex.signals == [(a.id, False)]          # still within the grace period
    assert held_sets(sched), "GPUs are released only once the job is gone"
    clock.advance(6)
    sched.step()                                   # past it: SIGKILL
    assert ex.signals[-1] == (a.id, True)
    sched.step()
    assert sched.store.get(a.id).state == "cancelled" and not held_sets(sched)
    queued = sched.submit(job(gpus=8, min_gpus=8))
    sched.submit(job(gpus=8, min_gpus=8))
    sched.step()
    later = sched.store.jobs()[-1]
    sched.cancel(later.id)
    assert sched.store.get(later.id).state == "cancelled" and sched.store.get(queued.id).state == "running"
    with pytest.raises(UsageError, match="already ended"):
        sched.cancel(later.id)


def test_lost_and_unstartable_jobs_say_why(tmp_path):
    sched, ex, _ = make(tmp_path)
    a = sched.submit(job())
    sched.step()
    ex.status[f"h{a.id}"] = Status(GONE, reason="the job's process group ended without an exit status")
    sched.step()
    assert sched.store.get(a.id).state == "lost" and "without an exit status" in sched.store.get(a.id).reason
    ex.refuse = True
    b = sched.submit(job())
    sched.step()
    assert sched.store.get(b.id).state == "failed" and "no such partition" in sched.store.get(b.id).reason


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_gpu_counts_are_exact_unless_min_gpus_opts_into_elasticity(tmp_path, policy):
    sched, _, _ = make(tmp_path, policy=policy)          # 2 x 4 GPUs
    # cifar10 at global batch 64 scales poorly: a sizing policy would give it few GPUs if it could
    exact = sched.submit(job(gpus=3, app="cifar10", batch_size=64))
    elastic = sched.submit(job(gpus=4, app="cifar10", batch_size=64, min_gpus=2))
    sched.step()
    # it computes on exactly 3 (fifo and backfill hold the whole node, as LSF does, and show it 3)
    assert len(sched.launch_of(sched.store.get(exact.id)).visible) == 3
    got = sched.store.get(elastic.id)
    assert got.state == "queued" or 2 <= len(sched.launch_of(got).visible) <= 4
    assert sched.describe(sched.store.get(exact.id))["min_gpus"] == 3


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_a_job_without_an_app_is_any_program_and_runs_on_exactly_its_gpus(tmp_path, policy):
    sched, _, _ = make(tmp_path, policy=policy, model=daemon_model())    # 2 x 4 GPUs, all idle
    request = job_from_mapping({"cmd": "python train.py", "gpus": 3}, daemon_model().apps)
    assert request.app == "" and request.model_app == "linear"
    anything = sched.submit(request)
    sched.step()
    got = sched.store.get(anything.id)
    assert got.state != "queued" and len(sched.launch_of(got).visible) == 3   # never grown onto the idle GPUs
    with pytest.raises(ConfigError, match="an elastic job needs `app`"):
        JobRequest(cmd="python train.py", gpus=4, min_gpus=2)
    with pytest.raises(ConfigError, match="an elastic job needs `app`"):
        job_from_mapping({"cmd": "python train.py", "gpus": 2, "max_gpus": 4}, daemon_model().apps)


def test_jobs_larger_than_the_cluster_are_refused(tmp_path):
    sched, _, _ = make(tmp_path)
    with pytest.raises(UsageError, match="gpus: 9 is more GPUs than the cluster has"):
        sched.submit(job(gpus=9))
    with pytest.raises(UsageError, match="max_gpus: 12"):
        sched.submit(job(gpus=4, max_gpus=12))
    assert sched.store.jobs() == []


def test_job_and_cluster_specs_name_the_bad_field(tmp_path):
    for data, field in [({"cmd": "x", "app": "ncf"}, "gpus"), ({"cmd": "", "app": "ncf", "gpus": 1}, "cmd"),
                        ({"cmd": "x", "app": "ncf", "gpus": 0}, "gpus"),
                        ({"cmd": "x", "app": "ncf", "gpus": 2, "max_gpus": 1}, "max_gpus"),
                        ({"cmd": "x", "app": "ncf", "gpus": 1, "env": {"CUDA_VISIBLE_DEVICES": "0"}}, "env"),
                        ({"cmd": "x", "app": "llama", "gpus": 1}, "app"),
                        ({"cmd": "x", "app": "ncf", "gpus": 1, "priority": 3}, "priority")]:
        with pytest.raises(ConfigError, match=field):
            job_from_mapping(data, MODEL.apps)
    bad = tmp_path / "cluster.toml"
    for text, field in [('[[nodes]]\nname="a"\ngpus=4\n[[nodes]]\nname="a"\ngpus=4\n', "names repeat"),
                        ('[[nodes]]\nname="a"\ngpus=2\ndevices=[0]\n', "devices"),
                        ('nodes = []\n', "nodes"), ('[[nodes]]\nname="a"\ngpus=4\nram=3\n', "ram")]:
        bad.write_text(text)
        with pytest.raises(ConfigError, match=field):
            load_cluster(bad)


def _real(tmp_path, grace):
    from mlsyskit.core.clock import RealClock
    from mlsyskit.tools.sched.executors.local import LocalExecutor

    cluster = ClusterConfig((NodeConfig("n0", 4, logical=True),))
    return Scheduler(cluster, JobStore(tmp_path / "jobs.db"), LocalExecutor(), create_policy("fifo", MODEL), MODEL,
                     RealClock(), tmp_path, cancel_grace_s=grace)


def _step_until(sched, condition, timeout, what):
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sched.step()
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@pytest.mark.slow
def test_a_stopped_job_is_cancelled_without_waiting_for_the_kill(tmp_path):
    import os
    import signal

    sched = _real(tmp_path, grace=600.0)   # a SIGKILL would come only after 10 minutes
    a = sched.submit(JobRequest(cmd="sleep 300", app="ncf", gpus=1))
    _step_until(sched, lambda: sched.store.get(a.id).state == "running", 30, "the start")
    os.killpg(int(sched.store.get(a.id).handle), signal.SIGSTOP)
    sched.cancel(a.id)
    _step_until(sched, lambda: sched.store.get(a.id).state == "cancelled", 30, "the cancel of a stopped job")


@pytest.mark.slow
def test_a_job_that_ignores_sigterm_is_killed_after_the_grace(tmp_path):
    sched = _real(tmp_path, grace=0.5)
    ready = tmp_path / "ready"
    a = sched.submit(JobRequest(cmd=f"trap '' TERM; touch {ready}; while :; do sleep 0.1; done", app="ncf", gpus=1))
    _step_until(sched, ready.exists, 30, "the job to install its trap")
    sched.cancel(a.id)
    import time

    t0 = time.monotonic()
    _step_until(sched, lambda: sched.store.get(a.id).state == "cancelled", 30, "the kill")
    assert time.monotonic() - t0 >= 0.5, "cancelled before the grace: the loop that ignores SIGTERM was still alive"
    assert not sched.store.jobs(("running", "cancelling"))
    from mlsyskit.tools.sched.executors.local import _group_members

    job = sched.store.get(a.id)
    assert _group_members(int(job.handle), Path(job.run_dir)) == []


@pytest.mark.slow
def test_background_leftovers_of_a_finished_job_are_killed(tmp_path):
    from mlsyskit.tools.sched.executors.local import _group_members

    sched = _real(tmp_path, grace=10.0)
    a = sched.submit(JobRequest(cmd="sleep 300 & echo started", app="ncf", gpus=1))
    _step_until(sched, lambda: sched.store.get(a.id).state == "done", 30, "the job to end")
    job = sched.store.get(a.id)
    assert _group_members(int(job.handle), Path(job.run_dir)) == []


@pytest.mark.slow
def test_a_job_reports_progress_through_marble_progress(tmp_path):
    sched = _real(tmp_path, grace=10.0)
    cmd = 'echo "100.0 0 2.0" >> "$MARBLE_PROGRESS"; echo "110.0 640 1.5" >> "$MARBLE_PROGRESS"'
    a = sched.submit(JobRequest(cmd=cmd, app="ncf", gpus=1))
    _step_until(sched, lambda: sched.store.get(a.id).state == "done", 30, "the job")
    assert sched.store.get(a.id).samples == 640.0


def test_a_job_larger_than_a_node_spans_nodes_with_each_nodes_own_ids(tmp_path):
    sched, ex, _ = make(tmp_path)    # 2 nodes x 4 logical GPUs on one machine: ids 0-3 and 4-7
    big = sched.submit(job(gpus=6, min_gpus=6, app="bert"))
    sched.step()
    launch = sched.launch_of(sched.store.get(big.id))
    assert ex.launched == [big.id] and sorted(len(s.held) for s in launch.nodes) == [2, 4]
    for part in launch.nodes:
        node = int(part.node[1:])
        assert set(part.held) <= set(range(4 * node, 4 * node + 4))
    env = launch.job_env()
    assert env["MARBLE_GPUS"] == "6" and len(set(env["CUDA_VISIBLE_DEVICES"].split(","))) == 6
