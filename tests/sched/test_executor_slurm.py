"""The Slurm executor against a real single-machine Slurm 22.05 with 4 fake GPUs (.ci/slurm_start.sh).

Skips where Slurm is not installed or not running; CI installs and starts it.
"""
import shutil
import subprocess
import time

import pytest

from mlsyskit.core.clock import RealClock
from mlsyskit.tools.sched.daemon.jobstore import JobStore
from mlsyskit.tools.sched.daemon.scheduler import Scheduler
from mlsyskit.tools.sched.daemon.specs import ClusterConfig, JobRequest, NodeConfig
from mlsyskit.tools.sched.executors.base import Launch, NodeSlice
from mlsyskit.tools.sched.executors.slurm import SlurmExecutor, parse_show_job, sbatch_argv
from mlsyskit.tools.sched.policies import create_policy
from mlsyskit.tools.sched.throughput import ThroughputModel

pytestmark = pytest.mark.slow   # real processes (and a server or Slurm)

INSTALL = ("needs a running Slurm: apt-get install slurmctld slurmd slurm-client munge, "
           "then run .ci/slurm_start.sh as root (single host, 4 fake GPUs)")


def slurm_node(timeout: float = 15.0) -> tuple[str, int] | None:
    """(NodeName, GPUs) of a usable Slurm node, polling briefly (a node may still be completing jobs)."""
    if shutil.which("sbatch") is None or shutil.which("sinfo") is None:
        return None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %G %T"], capture_output=True, text=True, timeout=5)
        except subprocess.TimeoutExpired:
            continue
        for line in out.stdout.splitlines():
            name, gres, state = line.split()
            if gres.startswith("gpu:") and state.rstrip("*") in ("idle", "mixed", "allocated", "completing"):
                return name, int(gres.split(":")[-1].split("(")[0])
        time.sleep(0.2)
    return None


def test_sbatch_command_follows_the_placement(tmp_path):
    even = Launch(1, "a", "true", tmp_path, "", {}, (NodeSlice("n0", "h0", (0, 1), (0, 1)),
                                                      NodeSlice("n1", "h1", (2, 3), (2, 3))), "marble-x-1")
    argv = sbatch_argv(even, "job.sh")
    assert "--nodes=2" in argv and "--nodelist=h0,h1" in argv and "--gres=gpu:2" in argv and ":" not in argv
    uneven = Launch(2, "b", "true", tmp_path, "", {}, (NodeSlice("n0", "h0", (0, 1, 2), (0, 1, 2)),
                                                        NodeSlice("n1", "h1", (0,), (0,))), "marble-x-2")
    argv = sbatch_argv(uneven, "job.sh")
    assert argv.index("--gres=gpu:3") < argv.index(":") < argv.index("--gres=gpu:1")  # a heterogeneous job
    fields = parse_show_job("JobId=7 JobName=x JobState=FAILED Reason=NonZeroExitCode ExitCode=3:0 Command=/a b")
    assert fields["JobState"] == "FAILED" and fields["ExitCode"] == "3:0"


def test_two_2gpu_jobs_share_a_4gpu_node_a_third_waits_cancel_works(tmp_path):
    node = slurm_node()
    if node is None:
        pytest.skip(INSTALL)
    host, gpus = node
    if gpus < 4:
        pytest.skip(f"needs a node with 4 fake GPUs, {host} has {gpus}")
    model = ThroughputModel()
    cluster = ClusterConfig((NodeConfig("n0", 4, host=host),))
    sched = Scheduler(cluster, JobStore(tmp_path / "jobs.db"), SlurmExecutor(), create_policy("marble", model),
                      model, RealClock(), tmp_path)
    seen = tmp_path / "seen"
    seen.mkdir()
    cmd = f'echo "$CUDA_VISIBLE_DEVICES" > {seen}/$MARBLE_JOB_ID; sleep 300'
    ids = [sched.submit(JobRequest(cmd=cmd, app="bert", gpus=2, min_gpus=2, workdir=str(tmp_path))).id
           for _ in range(3)]

    def step_until(condition, timeout, what):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            sched.step()
            if condition():
                return
            time.sleep(0.2)
        raise AssertionError(f"timed out after {timeout}s waiting for {what}")

    try:
        step_until(lambda: all((seen / str(i)).exists() for i in ids[:2]), 60, "two jobs to run")
        first, second = ((seen / str(i)).read_text().split() for i in ids[:2])
        assert len(first) == 1 and len(second) == 1
        a, b = set(first[0].split(",")), set(second[0].split(","))
        assert len(a) == len(b) == 2 and not a & b, (a, b)     # Slurm's CUDA_VISIBLE_DEVICES, disjoint
        assert sched.store.get(ids[2]).state == "queued"       # the third waits for GPUs
        handle = sched.store.get(ids[0]).handle
        sched.cancel(ids[0])
        step_until(lambda: sched.store.get(ids[0]).state == "cancelled", 60, "the cancel")
        state = parse_show_job(subprocess.run(["scontrol", "show", "job", "-o", handle], capture_output=True,
                                              text=True, timeout=10).stdout)["JobState"]
        assert state == "CANCELLED"
        step_until(lambda: (seen / str(ids[2])).exists(), 60, "the third job to start on the freed GPUs")
        third = set((seen / str(ids[2])).read_text().split()[0].split(","))
        assert third == a and not third & b
    finally:
        for job in sched.store.jobs(("running", "cancelling")):
            subprocess.run(["scancel", job.handle], timeout=10, check=False)


def test_a_launch_cut_short_is_found_by_name_after_a_restart(tmp_path):
    node = slurm_node()
    if node is None:
        pytest.skip(INSTALL)
    host, _ = node
    ex = SlurmExecutor()
    spec = Launch(1, "a", "sleep 300", tmp_path / "run", str(tmp_path), {},
                  (NodeSlice("n0", host, (0,), (0,)),), f"marble-test{time.monotonic_ns()}-1")
    never = Launch(2, "b", "true", tmp_path / "run2", str(tmp_path), {}, spec.nodes, spec.tag[:-2] + "-2")
    handle = ex.launch(spec)
    try:
        assert SlurmExecutor().recover(spec) == handle      # the daemon died before recording the job id
        assert SlurmExecutor().recover(never) is None       # never submitted: safe to queue again
        assert ex.poll(spec, handle).kind == "running"
        ex.cancel(spec, handle, force=False)
        deadline = time.monotonic() + 60
        while (status := ex.poll(spec, handle)).kind == "running":
            assert time.monotonic() < deadline
            time.sleep(0.2)
        assert status.kind == "gone" and "CANCELLED" in status.reason
    finally:
        subprocess.run(["scancel", handle], timeout=10, check=False)


def test_marble_serve_with_the_slurm_executor_end_to_end(tmp_path):
    import json
    import sys

    node = slurm_node()
    if node is None:
        pytest.skip(INSTALL)
    host, _ = node
    marble = [sys.executable, "-c", "from mlsyskit.tools.sched.cli import main; main()"]
    (tmp_path / "cluster.toml").write_text(f'[[nodes]]\nname = "n0"\ngpus = 4\nhost = "{host}"\n')
    state = tmp_path / "state"
    with (tmp_path / "serve.err").open("w") as err:
        proc = subprocess.Popen([*marble, "serve", "--cluster", str(tmp_path / "cluster.toml"), "--executor", "slurm",
                                 "--state-dir", str(state), "--poll-interval", "0.2"], stderr=err)
    try:
        deadline = time.monotonic() + 60
        while not (state / "daemon.json").exists():
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "serve.err").read_text()
            time.sleep(0.05)

        def cli(*args):
            res = subprocess.run([*marble, *args, "--state-dir", str(state)], capture_output=True, text=True,
                                 timeout=60)
            assert res.returncode == 0, res.stderr
            return res.stdout

        job = cli("submit", "--cmd", 'echo "gpus=$CUDA_VISIBLE_DEVICES job=$MARBLE_JOB_ID"', "--app", "ncf",
                  "--gpus", "2", "--min-gpus", "2", "--workdir", str(tmp_path)).strip()
        deadline = time.monotonic() + 60
        while (doc := json.loads(cli("status", job, "--json"))[0])["state"] not in ("done", "failed", "lost"):
            assert time.monotonic() < deadline, doc
            time.sleep(0.2)
        assert doc["state"] == "done" and doc["exit_code"] == 0 and doc["handle"].isdigit()
        out = cli("logs", job)
        assert out.startswith("gpus=") and f"job={job}" in out and len(out.split()[0][5:].split(",")) == 2
    finally:
        proc.terminate()
        proc.wait(15)
