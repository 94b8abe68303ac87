"""The local executor: process groups, exit codes, logs, cancel, and re-attaching after a restart."""
import os
import signal
import time
from pathlib import Path

import pytest

from mlsyskit.core.clock import VirtualClock
from mlsyskit.tools.sched.executors.base import EXITED, GONE, RUNNING, Launch, NodeSlice
from mlsyskit.tools.sched.executors.local import LocalExecutor

pytestmark = pytest.mark.slow   # real processes (and a server or Slurm)


def launch(tmp_path: Path, cmd: str, job_id: int = 1) -> Launch:
    return Launch(job_id, f"j{job_id}", cmd, tmp_path / f"run{job_id}", str(tmp_path), {"EXTRA": "x y"},
                  (NodeSlice("n0", "n0", (2, 3), (2, 3)), NodeSlice("n1", "n1", (4, 5, 6), (4,))), f"marble-t-{job_id}")


def poll_until(ex, spec, handle, kind, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = ex.poll(spec, handle)
        if status.kind == kind:
            return status
        time.sleep(0.02)
    raise AssertionError(f"job did not reach {kind} within {timeout}s")


def test_exit_code_log_and_environment(tmp_path):
    ex = LocalExecutor()
    spec = launch(tmp_path, 'echo "$CUDA_VISIBLE_DEVICES|$MARBLE_PLACEMENT|$EXTRA|$MARBLE_GPUS"; echo err >&2; exit 7')
    handle = ex.launch(spec)
    status = poll_until(ex, spec, handle, EXITED)
    assert status.exit_code == 7
    assert spec.log_path.read_text() == "2,3,4|n0:2,3;n1:4|x y|3\nerr\n"


def test_cancel_kills_the_whole_group(tmp_path):
    ex = LocalExecutor()
    spec = launch(tmp_path, f"sleep 300 & echo $! > {tmp_path}/child; wait")
    handle = ex.launch(spec)
    deadline = time.monotonic() + 30
    while not (tmp_path / "child").exists() or not (tmp_path / "child").read_text().strip():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    child = int((tmp_path / "child").read_text())
    ex.cancel(spec, handle, force=False)
    assert poll_until(ex, spec, handle, GONE).reason   # killed: no exit status
    deadline = time.monotonic() + 30
    while Path(f"/proc/{child}").exists() and "Z" not in Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1][:3]:
        assert time.monotonic() < deadline, "the grandchild outlived the cancel"
        time.sleep(0.02)


def test_a_restarted_executor_reattaches_and_reads_the_exit_code(tmp_path):
    first = LocalExecutor()
    spec = launch(tmp_path, f"while [ ! -e {tmp_path}/go ]; do sleep 0.05; done; exit 4")
    handle = first.launch(spec)
    second = LocalExecutor()  # knows the job only by pid and run dir, as after a daemon restart
    assert second.poll(spec, handle).kind == RUNNING
    assert second.recover(spec) == handle
    (tmp_path / "go").touch()
    assert poll_until(second, spec, handle, EXITED).exit_code == 4
    first.poll(spec, handle)  # reap


def test_a_reused_pid_or_an_outside_kill_is_not_taken_for_the_job(tmp_path):
    ex = LocalExecutor()
    spec = launch(tmp_path, "sleep 300")
    ex.launch(spec)
    impostor = str(os.getpgrp())  # a live process group, but not this job's
    assert LocalExecutor().poll(spec, impostor).kind == GONE
    ex.cancel(spec, impostor, force=True)  # must not signal an unrelated process group
    other = launch(tmp_path, f"touch {tmp_path}/up; sleep 300", job_id=2)
    handle = ex.launch(other)
    deadline = time.monotonic() + 30
    while not (tmp_path / "up").exists():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    os.kill(int(handle), signal.SIGKILL)  # only the wrapper: the job's command still runs and holds its GPUs
    assert poll_until(ex, other, handle, RUNNING).kind == RUNNING
    os.killpg(int(handle), signal.SIGKILL)  # now all of it, from outside marble: no exit status
    status = poll_until(ex, other, handle, GONE)
    assert "without an exit status" in status.reason
    ex.cancel(spec, ex.recover(spec), force=True)
    poll_until(ex, spec, ex.recover(spec), GONE)


def test_recover_says_never_started_without_waiting_on_a_virtual_clock(tmp_path):
    ex = LocalExecutor(clock=VirtualClock(), recover_grace_s=5.0)
    spec = launch(tmp_path, "true")
    spec.run_dir.mkdir()
    assert ex.recover(spec) is None
