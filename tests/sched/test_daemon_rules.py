"""The daemon's Slurm-like rules on its scheduling loop, without processes: a fake executor and a
virtual clock. Admission, pending reasons, wall time, dependencies, arrays, fair share, keyed submits."""
import pytest
from test_daemon_scheduler import FakeExecutor

from mlsyskit.core.clock import VirtualClock
from mlsyskit.core.config import ConfigError
from mlsyskit.core.errors import UsageError
from mlsyskit.tools.sched.daemon import admission
from mlsyskit.tools.sched.daemon.jobstore import JobStore
from mlsyskit.tools.sched.daemon.scheduler import Scheduler
from mlsyskit.tools.sched.daemon.specs import (
    ClusterConfig,
    JobRequest,
    NodeConfig,
    job_from_mapping,
    parse_array,
    parse_dependency,
    parse_time,
)
from mlsyskit.tools.sched.executors.base import EXITED, Status
from mlsyskit.tools.sched.policies import POLICIES, create_policy
from mlsyskit.tools.sched.throughput import ThroughputModel

MODEL = ThroughputModel()


def make(tmp_path, sizes=(4, 2, 2), policy="marble-fifo", max_time_s=0.0):
    cluster = ClusterConfig(tuple(NodeConfig(f"n{i}", g, logical=True) for i, g in enumerate(sizes)))
    clock = VirtualClock(1000.0)
    ex = FakeExecutor()
    sched = Scheduler(cluster, JobStore(tmp_path / "jobs.db"), ex, create_policy(policy, MODEL), MODEL, clock,
                      tmp_path, cancel_grace_s=10.0, max_time_s=max_time_s)
    return sched, ex, clock


def job(gpus=1, **kw) -> JobRequest:
    return JobRequest(cmd="true", app="ncf", gpus=gpus, **kw)


def end(sched, ex, job_id, code=0):
    ex.status[f"h{job_id}"] = Status(EXITED, exit_code=code)


def state(sched, job_id):
    return sched.store.get(job_id).state


def pending(sched, job_id):
    return sched.describe(sched.store.get(job_id))["pending"]


def test_what_can_never_fit_is_refused_at_submit_and_what_can_runs_on_nodes_of_every_size(tmp_path):
    sched, ex, _ = make(tmp_path)                                   # nodes of 4, 2 and 2 GPUs
    with pytest.raises(UsageError, match="requested configuration is not available: 8 GPUs on one node; "
                                         "largest node has 4"):
        sched.submit(job(8, nodes=1))
    with pytest.raises(UsageError, match="7 GPUs on at most 2 nodes; the 2 largest have 6"):
        sched.submit(job(7, nodes=2))
    with pytest.raises(UsageError, match="gpus: 9 is more GPUs than the cluster has \\(8\\)"):
        sched.submit(job(9))
    assert sched.store.jobs() == []
    all8 = sched.submit(job(8))                                     # exact 8 = 4 + 2 + 2
    six = sched.submit(job(6))
    sched.step()
    assert sorted(len(s.visible) for s in sched.launch_of(sched.store.get(all8.id)).nodes) == [2, 2, 4]
    assert state(sched, six.id) == "queued" and pending(sched, six.id) == admission.RESOURCES
    end(sched, ex, all8.id)
    sched.step()
    sched.step()
    assert state(sched, six.id) == "running", "an 8-GPU job never blocks the next one once it ends"
    assert len(sched.launch_of(sched.store.get(six.id)).visible) == 6


def test_pending_reasons_resources_priority_dependency_and_qos_max_wall(tmp_path):
    sched, ex, _ = make(tmp_path, max_time_s=3600.0)
    big = sched.submit(job(8))
    sched.step()
    waits = sched.submit(job(2))
    behind = sched.submit(job(1))
    after = sched.submit(job(1, dependency=f"afterok:{big.id}"))
    too_long = sched.submit(job(1, time="2:00:00"))
    sched.step()
    assert [pending(sched, j.id) for j in (waits, behind, after, too_long)] == \
        ["Resources", "Priority", "Dependency", "QOSMaxWall"]
    assert sched.describe(sched.store.get(big.id))["pending"] == ""
    end(sched, ex, big.id)
    sched.step()
    sched.step()
    assert {state(sched, j.id) for j in (waits, behind, after)} == {"running"}
    assert state(sched, too_long.id) == "queued" and pending(sched, too_long.id) == "QOSMaxWall"


def test_a_dependency_that_fails_cancels_its_dependents_and_unknown_ones_are_refused(tmp_path):
    sched, ex, _ = make(tmp_path)
    first = sched.submit(job(1))
    dependent = sched.submit(job(1, dependency=f"afterok:{first.id}"))
    sched.step()
    assert pending(sched, dependent.id) == "Dependency" and ex.launched == [first.id]
    end(sched, ex, first.id, code=3)
    sched.step()
    sched.step()
    got = sched.store.get(dependent.id)
    assert got.state == "cancelled" and got.reason.startswith("DependencyNeverSatisfied: job 1 ended failed")
    assert ex.launched == [first.id]
    with pytest.raises(UsageError, match="dependency: no job 99"):
        sched.submit(job(1, dependency="afterok:99"))


def test_a_job_past_its_wall_time_is_stopped_and_ends_timeout(tmp_path):
    sched, ex, clock = make(tmp_path, max_time_s=600.0)
    limited = sched.submit(job(1, time="0:30"))                    # 30 s
    default = sched.submit(job(1))                                 # the daemon's --max-time
    sched.step()
    clock.advance(29)
    sched.step()
    assert ex.signals == []
    clock.advance(2)
    sched.step()
    assert ex.signals == [(limited.id, False)] and state(sched, limited.id) == "cancelling"
    ex.status[f"h{limited.id}"] = Status(EXITED, exit_code=143)    # it honoured SIGTERM
    sched.step()
    got = sched.store.get(limited.id)
    assert got.state == "timeout" and got.reason.startswith("TimeLimit") and got.exit_code == 143
    assert sched.describe(got)["attained"] == pytest.approx(31.0), "GPU-seconds it held, once ended too"
    clock.advance(600)
    sched.step()
    assert (default.id, False) in ex.signals


def test_arrays_are_one_submit_of_many_jobs_with_their_task_ids_and_a_dependency_waits_for_all(tmp_path):
    sched, ex, _ = make(tmp_path)
    tasks = sched.submit_all(job(1, name="sweep"), "bob", parse_array("0-4:2"))
    assert [(j.name, j.array_task, j.array_job, j.user) for j in tasks] == \
        [(f"sweep[{t}]", t, tasks[0].id, "bob") for t in (0, 2, 4)]
    after = sched.submit(job(1, dependency=f"afterok:{tasks[0].id}"))
    sched.step()
    env = sched.launch_of(sched.store.get(tasks[2].id)).job_env()
    assert (env["MARBLE_ARRAY_JOB_ID"], env["MARBLE_ARRAY_TASK_ID"]) == (str(tasks[0].id), "4")
    end(sched, ex, tasks[0].id)
    end(sched, ex, tasks[1].id)
    sched.step()
    sched.step()
    assert pending(sched, after.id) == "Dependency", "one array task is still running"
    end(sched, ex, tasks[2].id)
    sched.step()
    sched.step()
    assert state(sched, after.id) == "running"


def test_fair_share_puts_a_light_user_ahead_of_a_heavy_one(tmp_path):
    sched, ex, clock = make(tmp_path, sizes=(1,))
    heavy = [sched.submit(job(1), user="alice") for _ in range(3)]
    sched.step()                                                  # alice's first runs
    clock.advance(3600)
    light = sched.submit(job(1), user="bob")                     # bob arrives after alice's backlog
    end(sched, ex, heavy[0].id)
    sched.step()
    sched.step()
    assert state(sched, light.id) == "running" and state(sched, heavy[1].id) == "queued"
    assert pending(sched, heavy[1].id) == "Resources"
    usage = sched.fair.usage(clock.now())
    assert usage["alice"] == pytest.approx(3600.0) and "bob" not in usage


def test_fair_order_interleaves_users_by_recent_use():
    order = admission.fair_order([(1, "a", 1), (2, "a", 1), (3, "a", 1), (4, "b", 1), (5, "b", 1)], {"a": 100.0})
    assert order == [4, 1, 5, 2, 3]
    share = admission.FairShare(half_life_s=100.0)
    share.add("a", 80.0, at=0.0)
    assert share.usage(100.0)["a"] == pytest.approx(40.0)


def test_a_submit_repeated_with_its_key_queues_nothing_new(tmp_path):
    sched, _, _ = make(tmp_path)
    first = sched.submit_all(job(1), "bob", (), key="k" * 16)
    again = sched.submit_all(job(1), "bob", (), key="k" * 16)
    array = sched.submit_all(job(1), "bob", (0, 1, 2), key="a" * 16)
    assert [j.id for j in again] == [j.id for j in first]
    assert [j.id for j in sched.submit_all(job(1), "bob", (0, 1, 2), key="a" * 16)] == [j.id for j in array]
    assert len(sched.store.jobs()) == 4
    sched.step()
    assert len(sched.store.jobs(("running",))) == 4


def test_job_fields_are_checked_and_named():
    assert parse_time("90") == 5400 and parse_time("1:30") == 90 and parse_time("2:00:00") == 7200
    assert parse_time("1-0") == 86400 and parse_time("1-2:03:04") == 93784 and parse_time("") == 0
    assert parse_dependency("afterok:3:4,afterok:5") == (3, 4, 5)
    assert parse_array("1,3,5-7") == (1, 3, 5, 6, 7)
    for data, message in [
        ({"gpus": 1.5}, "gpus: GPUs and nodes are whole numbers, got 1.5 (fractional GPUs are not supported)"),
        ({"gpus": 2, "min_gpus": 0.5}, "min_gpus: GPUs and nodes are whole numbers"),
        ({"gpus": 1, "batch_size": 1e12}, "batch_size: a whole number of samples in 1..10,000,000"),
        ({"gpus": 1, "batch_size": 10**12}, "batch_size: must be in 1..10,000,000"),
        ({"gpus": 1, "time": "1000000000"}, "time: '1000000000' is 694,444 days; the limit is 365 days"),
        ({"gpus": 1, "time": "soon"}, "time: 'soon' is not a wall time"),
        ({"gpus": 1, "dependency": "afterany:3"}, "dependency: 'afterany:3': use afterok"),
        ({"gpus": 1, "nodes": -1}, "nodes: must be in 1..4096"),
        ({"gpus": 2, "min_gpus": 3}, "min_gpus: must be in 1..gpus (2), got 3"),
    ]:
        with pytest.raises(ConfigError) as caught:
            job_from_mapping({"cmd": "true", "app": "ncf", **data}, MODEL.apps)
        assert message in str(caught.value), (data, str(caught.value))
    for text, message in [("0-9:0", "empty range"), ("x", "not a task range"), ("0-5000", "more than 1000 tasks")]:
        with pytest.raises(ValueError, match=message):
            parse_array(text)


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_an_exact_job_ahead_in_the_queue_is_not_starved_by_an_elastic_one_behind_it(tmp_path, policy):
    sched, ex, _ = make(tmp_path, policy=policy)                    # 4 + 2 + 2
    first = sched.submit(job(8))
    sched.step()
    six = sched.submit(job(6))
    elastic = sched.submit(job(4, min_gpus=1))
    sched.step()
    end(sched, ex, first.id)
    for _ in range(3):
        sched.step()
    assert state(sched, six.id) == "running", "the policy's elastic start behind it took the GPUs it needs"
    assert len(sched.launch_of(sched.store.get(six.id)).visible) == 6
    got = sched.store.get(elastic.id)
    assert got.state == "queued" or 1 <= len(sched.launch_of(got).visible) <= 2


def test_a_queued_job_that_no_longer_fits_waits_as_bad_constraints_and_blocks_nobody(tmp_path):
    sched, _, _ = make(tmp_path, sizes=(4, 4), policy="fifo")
    gone = sched.submit(job(8))                                    # fits 4 + 4 ...
    shrunk = Scheduler(ClusterConfig((NodeConfig("n0", 4, logical=True),)), sched.store, FakeExecutor(),
                       create_policy("fifo", MODEL), MODEL, VirtualClock(2000.0), tmp_path)
    small = shrunk.submit(job(2))                                  # ... not the restarted daemon's one node
    shrunk.step()
    assert pending(shrunk, gone.id) == "BadConstraints"
    assert state(shrunk, small.id) == "running", "fifo is strict, but a job that can never fit is not its head"
