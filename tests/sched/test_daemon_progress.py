"""Progress reports: parsing, what the policy sees from them, and the work history of finished jobs."""
import pytest

from mlsyskit.tools.sched.daemon import adapter
from mlsyskit.tools.sched.daemon.jobstore import Job
from mlsyskit.tools.sched.daemon.progress import TAIL_BYTES, Progress, read_progress
from mlsyskit.tools.sched.daemon.specs import ClusterConfig, JobRequest, NodeConfig
from mlsyskit.tools.sched.state import WorkHistory
from mlsyskit.tools.sched.throughput import ThroughputModel

MODEL = ThroughputModel()
CLUSTER = ClusterConfig((NodeConfig("n0", 4, logical=True),))


def test_reports_parse_first_and_last_whole_lines_and_skip_garbage(tmp_path):
    path = tmp_path / "progress"
    assert read_progress(path) is None
    path.write_bytes(b"junk\n100.0 0 2.5\nnan 5\n101.0 50 2.0\n102.0 -3\n104.0 200 1.5\n105.0 99")  # partial last
    report = read_progress(path)
    assert (report.t_first, report.s_first, report.t_last, report.s_last) == (100.0, 0.0, 104.0, 200.0)
    assert report.rate == pytest.approx(50.0) and report.losses == ((0.0, 2.5), (50.0, 2.0), (200.0, 1.5))
    with path.open("ab") as f:
        f.write(b"\n" + b"".join(f"{200 + i} {1000 + i} 1.0\n".encode() for i in range(TAIL_BYTES // 10)))
    report = read_progress(path)
    assert report.s_first == 0.0 and report.s_last == 1000 + TAIL_BYTES // 10 - 1 and len(report.losses) == 64
    path.write_bytes(b"100 5\n")
    assert read_progress(path).rate is None    # one point: no rate yet


def _job(job_id, state, started=None, ended=None, samples=None, gpus=None):
    return Job(job_id, f"j{job_id}", JobRequest(cmd="x", app="cifar10", gpus=2, batch_size=256), state, 0.0, started,
               ended, ((0, 2),) if gpus else (), (2,) if gpus else (), gpus or {}, "h" if gpus else None, None, "",
               "/tmp/x" if gpus else None, samples)


def test_the_policy_sees_reported_rate_progress_and_losses():
    running = _job(1, "running", started=1000.0, gpus={0: (0, 1)})
    report = Progress(1000.0, 0.0, 1100.0, 5000.0, ((5000.0, 1.2),))
    state = adapter.build_state(CLUSTER, [running, _job(2, "queued")], MODEL, 1110.0, {1: report})
    view = state.running[1]
    assert view.measured_rate == pytest.approx(50.0)
    assert view.progress_at(1110.0) == pytest.approx(5500.0)       # 5000 at t=1100, then 50/s
    assert view.attained_at(1110.0) == pytest.approx(2 * 110.0)    # GPU-seconds since the start
    assert view.loss_reports == [(5000.0, 1.2)]
    silent = adapter.build_state(CLUSTER, [running], MODEL, 1110.0, {}).running[1]
    assert silent.measured_rate == pytest.approx(MODEL.rate("cifar10", (2,), 256))   # no reports: the model


def test_finished_jobs_teach_the_history_their_reported_size():
    history = WorkHistory()
    adapter.learn(history, _job(3, "done", started=0.0, ended=100.0, samples=12345.0, gpus={0: (0, 1)}), MODEL)
    adapter.learn(history, _job(5, "failed", started=0.0, ended=100.0, samples=1.0, gpus={0: (0, 1)}), MODEL)
    adapter.learn(history, _job(6, "done", started=0.0, ended=10.0, gpus={0: (0, 1)}), MODEL)   # no reports
    assert sorted(history.by_app["cifar10"]) == pytest.approx(sorted([12345.0, 10 * MODEL.rate("cifar10", (2,), 256)]))
    state = adapter.build_state(CLUSTER, [_job(4, "queued")], MODEL, 200.0, history=history)
    assert state.history is history


def test_the_scheduler_remembers_finished_jobs_across_a_restart(tmp_path):
    from test_daemon_scheduler import FakeExecutor

    from mlsyskit.core.clock import VirtualClock
    from mlsyskit.tools.sched.daemon.jobstore import JobStore
    from mlsyskit.tools.sched.daemon.scheduler import Scheduler
    from mlsyskit.tools.sched.executors.base import EXITED, Status
    from mlsyskit.tools.sched.policies import create_policy

    store, clock, ex = JobStore(tmp_path / "jobs.db"), VirtualClock(0.0), FakeExecutor()
    sched = Scheduler(CLUSTER, store, ex, create_policy("marble", MODEL), MODEL, clock, tmp_path)
    job = sched.submit(JobRequest(cmd="x", app="ncf", gpus=1))
    sched.step()
    clock.advance(50)
    ex.status[f"h{job.id}"] = Status(EXITED, exit_code=0)
    sched.step()
    assert len(sched.history.by_app["ncf"]) == 1
    again = Scheduler(CLUSTER, store, FakeExecutor(), create_policy("marble", MODEL), MODEL, clock, tmp_path)
    assert list(again.history.by_app["ncf"]) == list(sched.history.by_app["ncf"])
