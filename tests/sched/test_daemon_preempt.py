"""The daemon carries out the policy's preemptions on real process groups, and its in-memory queue
stays the job table's queue."""
import random
import time
from pathlib import Path

import pytest

from mlsyskit.core.clock import VirtualClock
from mlsyskit.tools.sched.daemon import adapter
from mlsyskit.tools.sched.daemon.jobstore import JobStore
from mlsyskit.tools.sched.daemon.scheduler import Scheduler
from mlsyskit.tools.sched.daemon.specs import ClusterConfig, JobRequest, NodeConfig
from mlsyskit.tools.sched.executors.local import LocalExecutor
from mlsyskit.tools.sched.policies import PolicyOptions, create_policy
from mlsyskit.tools.sched.throughput import ThroughputModel

pytestmark = pytest.mark.slow   # real processes (and a server or Slurm)

MODEL = ThroughputModel()


def scheduler(tmp_path: Path, policy: str, gpus: int = 2, options: PolicyOptions | None = None):
    cluster = ClusterConfig((NodeConfig("n0", gpus, logical=True),))
    clock = VirtualClock(1000.0)
    logged: list[str] = []
    sched = Scheduler(cluster, JobStore(tmp_path / "jobs.db"), LocalExecutor(), create_policy(policy, MODEL, options),
                      MODEL, clock, tmp_path, cancel_grace_s=5.0, log=logged.append)
    return sched, clock, logged


def step_until(sched, condition, what: str, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        sched.step()
        time.sleep(0.02)


def stop_all(sched, clock) -> None:
    """Cancel every job (queued ones too, so none starts), advancing the clock past the grace."""
    def settled():
        for job in sched.store.jobs(("queued", "launching", "running", "preempting")):
            sched.cancel(job.id)
        clock.advance(10.0)
        return not sched.store.jobs(("queued", "launching", "running", "cancelling", "preempting"))
    step_until(sched, settled, "every job to stop")


def group_alive(pgid: int) -> bool:
    """Any live (non-zombie) process in process group `pgid`."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
                return True
    return False


def test_tiresias_preempts_a_real_job_which_restarts_with_its_service_kept(tmp_path):
    # One node of 2 logical GPUs; LAS queues split at 10 GPU-s. Job 1 (2 GPUs) runs 100 virtual s
    # (200 GPU-s: the lower queue), then job 2 arrives in the top queue: tiresias preempts job 1.
    sched, clock, logged = scheduler(tmp_path, "tiresias", options=PolicyOptions(tiresias_thresholds=(10.0,)))
    marks = tmp_path / "starts"
    a = sched.submit(JobRequest(cmd=f"echo $MARBLE_RUN_DIR >> {marks}; exec sleep 120", app="cifar10", gpus=2,
                                name="long")).id
    step_until(sched, lambda: sched.store.get(a).state == "running" and marks.exists(), "job 1 to run")
    first_pid = int(sched.store.get(a).handle)
    clock.advance(100.0)
    b = sched.submit(JobRequest(cmd="exec sleep 0.3", app="cifar10", gpus=2, name="short")).id
    sched.step()
    assert sched.store.get(a).state == "preempting" and sched.store.get(b).state == "queued"
    # SIGTERM to the group; once it is gone job 1 is queued again with its service and a restart
    step_until(sched, lambda: sched.store.get(b).state in ("running", "done"), "job 2 to start on the freed GPUs")
    assert not group_alive(first_pid)
    again = sched.store.get(a)
    assert again.restarts == 1 and abs(again.attained - 200.0) < 1e-6
    assert any("restart 1" in line for line in logged)
    # job 2 ends; job 1 restarts from scratch in a fresh run directory, on the same device ids
    step_until(sched, lambda: sched.store.get(a).state == "running" and len(marks.read_text().split()) == 2,
               "job 1 to restart")
    runs = marks.read_text().split()
    assert runs[0].endswith("jobs/1") and runs[1].endswith("jobs/1-r1")
    assert sched.store.get(b).state == "done" and sched.store.get(a).gpus == {0: (0, 1)}
    # the restarted job's service counts on from what it had attained (tiresias ranks it by that)
    view = adapter.build_state(sched.cluster, sched.store.jobs(("running",)), MODEL, clock.now() + 5.0).running[a]
    assert abs(view.attained_at(clock.now() + 5.0) - 210.0) < 1e-6
    stop_all(sched, clock)
    assert sched.store.get(a).state == "cancelled"


def test_a_job_that_ignores_sigterm_is_killed_after_the_grace_and_still_requeued(tmp_path):
    sched, clock, _ = scheduler(tmp_path, "tiresias", options=PolicyOptions(tiresias_thresholds=(10.0,)))
    ready = tmp_path / "ready"
    a = sched.submit(JobRequest(cmd=f"trap '' TERM; touch {ready}; while :; do sleep 0.05; done", app="ncf", gpus=2)).id
    step_until(sched, lambda: ready.exists(), "job 1 to trap SIGTERM")
    pid = int(sched.store.get(a).handle)
    clock.advance(100.0)
    sched.submit(JobRequest(cmd="exec sleep 60", app="ncf", gpus=2))
    sched.step()
    assert sched.store.get(a).state == "preempting"
    sched.step()
    # the wrapper dies of the SIGTERM, the command ignores it: the group lives and holds its GPUs
    assert sched.store.get(a).state == "preempting" and group_alive(pid)
    clock.advance(6.0)                                                    # past the 5 s grace: SIGKILL
    step_until(sched, lambda: sched.store.get(a).state == "queued", "job 1 to be requeued")
    assert not group_alive(pid) and sched.store.get(a).restarts == 1
    stop_all(sched, clock)


def test_in_memory_queue_follows_the_job_table(tmp_path):
    # Random submits, cancels and restarts (a new Scheduler on the same table, as after a crash):
    # after every step the kept queue is the table's queued jobs, in order, with the same views.
    rng = random.Random(11)
    store = JobStore(tmp_path / "jobs.db")
    cluster = ClusterConfig((NodeConfig("n0", 4, logical=True),))
    clock = VirtualClock(0.0)

    sched = Scheduler(cluster, store, LocalExecutor(), create_policy("marble", MODEL), MODEL, clock, tmp_path)
    for round_ in range(40):
        for _ in range(rng.randrange(4)):
            sched.submit(JobRequest(cmd="true", app=rng.choice(MODEL.apps), gpus=rng.choice([1, 2, 4])))
        queued = store.jobs(("queued",))
        if queued and rng.random() < 0.3:
            sched.cancel(rng.choice(queued).id)
        if rng.random() < 0.1:
            sched = Scheduler(cluster, store, LocalExecutor(), create_policy("marble", MODEL), MODEL, clock, tmp_path)
            sched.recover()
        clock.advance(1.0)
        sched.step()
        table = {j.id: adapter.queued_view(j, MODEL) for j in store.jobs(("queued",))}
        assert list(sched._queued) == list(table), round_
        for job_id, (_, view) in sched._queued.items():
            want = table[job_id]
            assert (view.app, view.gpus, view.batch_size, view.arrival, view.attained, view.restarts) == \
                   (want.app, want.gpus, want.batch_size, want.arrival, want.attained, want.restarts)
    stop_all(sched, clock)


def test_a_job_that_finished_as_it_was_preempted_is_done_not_run_again(tmp_path):
    # The exit status decides: 0 written before the group died means the work is done; a job
    # killed by the preemption (no exit status, or non-zero) is queued again.
    from test_daemon_scheduler import FakeExecutor

    from mlsyskit.tools.sched.executors.base import EXITED, GONE, Status

    class Restartable(FakeExecutor):
        restartable = True

    ex = Restartable()
    cluster = ClusterConfig((NodeConfig("n0", 2, logical=True),))
    clock = VirtualClock(0.0)
    sched = Scheduler(cluster, JobStore(tmp_path / "jobs.db"), ex,
                      create_policy("tiresias", MODEL, PolicyOptions(tiresias_thresholds=(10.0,))), MODEL, clock, tmp_path)
    for ending, want in ((Status(EXITED, exit_code=0), "done"), (Status(GONE, reason="killed"), "queued")):
        old = sched.submit(JobRequest(cmd="x", app="ncf", gpus=2)).id
        sched.step()
        clock.advance(100.0)
        sched.submit(JobRequest(cmd="y", app="ncf", gpus=2))
        sched.step()
        assert sched.store.get(old).state == "preempting" and (old, False) in ex.signals
        ex.status[sched.store.get(old).handle] = ending
        sched.step()
        assert sched.store.get(old).state == want, ending
        assert ex.launched.count(old) == 1
        for job in sched.store.jobs(("queued", "running")):   # a clean slate for the next case
            if job.state == "queued":
                sched.cancel(job.id)
            else:
                ex.status[job.handle] = Status(EXITED, exit_code=0)
        sched.step()
