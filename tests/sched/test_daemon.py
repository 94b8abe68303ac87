"""The marble daemon end to end: `marble serve` with the local executor as a subprocess, jobs
submitted through the CLI, the daemon SIGKILLed mid-run and restarted."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import invoke_cli

from mlsyskit.tools.sched.cli import app
from mlsyskit.tools.sched.daemon.client import RETRY_FOR_S, DaemonClient, Endpoint

pytestmark = pytest.mark.slow   # real processes (and a server or Slurm)

MARBLE = [sys.executable, "-c", "from mlsyskit.tools.sched.cli import main; main()"]
CLUSTER = """
[[nodes]]
name = "n0"
gpus = 4
logical = true

[[nodes]]
name = "n1"
gpus = 4
logical = true
"""
# Each job records its own view: which devices it saw and when it ran (wall clock, ns).
JOB = ('echo "start $MARBLE_JOB_ID $MARBLE_PLACEMENT $(date +%s%N)" >> {markers}; sleep {secs}; '
       'echo "end $MARBLE_JOB_ID $(date +%s%N)" >> {markers}')


def wait_for(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def marble(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    res = subprocess.run([*MARBLE, *args], capture_output=True, text=True, timeout=60)
    if check:
        assert res.returncode == 0, (args, res.stdout, res.stderr)
    return res


class Daemon:
    def __init__(self, tmp: Path, *extra: str) -> None:
        self.tmp, self.state = tmp, tmp / "state"
        (tmp / "cluster.toml").write_text(CLUSTER)
        self.extra = extra
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.err = (self.tmp / f"serve-{time.monotonic_ns()}.err").open("w")
        self.proc = subprocess.Popen([*MARBLE, "serve", "--cluster", str(self.tmp / "cluster.toml"), "--state-dir",
                                      str(self.state), "--poll-interval", "0.1", *self.extra],
                                     stdout=subprocess.DEVNULL, stderr=self.err)
        pid = self.proc.pid

        def ready():
            assert self.proc.poll() is None, (self.tmp / self.err.name).read_text()
            try:
                return json.loads((self.state / "daemon.json").read_text())["pid"] == pid
            except (OSError, ValueError, KeyError):
                return False
        try:
            wait_for(ready, 60, "the daemon to serve")
        except BaseException:
            self.stop()   # a daemon that did not come up in time is stopped too: no fixture teardown runs
            raise

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.err.close()

    def cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return marble(*args, "--state-dir", str(self.state), check=check)

    def jobs(self) -> list[dict]:
        return json.loads(self.cli("status", "--json").stdout)

    def polled_jobs(self) -> list[dict]:
        """The jobs as `status --json` lists them, asked in-process: for polling (a CLI process per poll
        costs half a CPU second, and a wait polls dozens of times)."""
        return DaemonClient(Endpoint.resolve(self.state)).call("status", None, RETRY_FOR_S)["jobs"]


@pytest.fixture
def daemon(tmp_path):
    # marble-fifo packs jobs and never preempts: these tests count every start of a job as a launch
    # (the default policy preempts by attained service, which runs a job again by design)
    d = Daemon(tmp_path, "--policy", "marble-fifo")
    d.start()
    yield d
    d.stop()
    kill_leftover_jobs(d.state)


def kill_leftover_jobs(state: Path) -> None:
    """Every job process group this test started is gone afterwards."""
    for pid_file in state.glob("jobs/*/pid"):
        try:
            os.killpg(int(pid_file.read_text()), signal.SIGKILL)
        except (ProcessLookupError, ValueError, PermissionError):
            pass


def parse_markers(path: Path) -> dict[int, dict]:
    runs: dict[int, dict] = {}
    for line in path.read_text().splitlines():
        parts = line.split()
        job = int(parts[1])
        if parts[0] == "start":
            assert job not in runs, f"job {job} started twice"
            devices = {}
            for entry in parts[2].split(";"):
                node, ids = entry.split(":")
                devices[node] = {int(i) for i in ids.split(",")}
            runs[job] = {"devices": devices, "start": int(parts[3]), "end": None}
        else:
            runs[job]["end"] = int(parts[2])
    return runs


def check_no_gpu_shared(runs: dict[int, dict], node_devices: dict[str, set[int]]) -> int:
    """Concurrent jobs hold disjoint GPUs; every id belongs to its node. Returns the peak overlap seen."""
    peak = 0
    for a, ra in runs.items():
        for node, ids in ra["devices"].items():
            assert ids <= node_devices[node], (a, node, ids)
        overlapping = 0
        for b, rb in runs.items():
            if a < b and ra["start"] < rb["end"] and rb["start"] < ra["end"]:
                overlapping += 1
                for node in ra["devices"].keys() & rb["devices"].keys():
                    assert not ra["devices"][node] & rb["devices"][node], (a, b, node)
        peak = max(peak, overlapping)
    return peak


def test_twenty_jobs_survive_a_sigkilled_daemon_none_lost_none_run_twice(daemon, tmp_path):
    markers = tmp_path / "markers.txt"
    apps = ["cifar10", "ncf", "bert", "deepspeech2"]
    client = DaemonClient(Endpoint.resolve(daemon.state))  # one process submits quickly, so jobs overlap
    for i in range(20):
        client.call("submit", {"job": {"cmd": JOB.format(markers=markers, secs=1.0 + 0.25 * (i % 4)),
                                       "app": apps[i % 4], "gpus": 1 + i % 4, "name": f"job{i}"}})
    # Kill the daemon once several jobs have run and others are still running or queued.
    wait_for(lambda: markers.exists() and markers.read_text().count("end ") >= 4, 120, "4 jobs to end")
    daemon.kill9()
    assert markers.read_text().count("start ") < 20, "the kill came too late to test recovery"
    daemon.start()
    wait_for(lambda: all(j["state"] == "done" for j in daemon.polled_jobs()), 180, "all jobs done")
    jobs = daemon.jobs()
    assert len(jobs) == 20 and all(j["exit_code"] == 0 for j in jobs)
    runs = parse_markers(markers)
    assert sorted(runs) == [j["id"] for j in jobs] and all(r["end"] for r in runs.values())
    peak = check_no_gpu_shared(runs, {"n0": {0, 1, 2, 3}, "n1": {4, 5, 6, 7}})
    assert peak >= 1, "no two jobs ever ran together: the test did not exercise sharing"
    for j in jobs:  # the daemon's own record agrees with what the job saw
        held = {{"0": "n0", "1": "n1"}[n]: set(ids) for n, ids in j["gpus"].items()}
        assert held == runs[j["id"]]["devices"], (j, runs[j["id"]])


def test_cancel_logs_nodes_and_errors(daemon, tmp_path):
    child_pid = tmp_path / "child.pid"
    long = daemon.cli("submit", "--cmd", f"echo begun; sleep 300 & echo $! > {child_pid}; wait", "--app", "ncf",
                      "--gpus", "4").stdout.strip()
    client = DaemonClient(Endpoint.resolve(daemon.state))
    wait_for(lambda: client.call("logs", {"job": int(long)}, RETRY_FOR_S)["data"].startswith(b"begun"), 60,
             "the job's output")
    assert daemon.cli("logs", long).stdout == "begun\n"
    nodes = json.loads(daemon.cli("nodes", "--json").stdout)
    assert sum(n["used"] for n in nodes) >= 1
    grandchild = int(wait_for(lambda: child_pid.exists() and child_pid.read_text().strip(), 30, "the child pid"))
    daemon.cli("cancel", long)
    wait_for(lambda: daemon.polled_jobs()[0]["state"] == "cancelled", 60, "the cancel")
    wait_for(lambda: not Path(f"/proc/{grandchild}").exists() or "Z" in Path(f"/proc/{grandchild}/stat").read_text()
             .rsplit(")", 1)[1].split()[0], 30, "the job's whole process group to die")
    assert daemon.cli("logs", long, "-f").stdout == "begun\n"   # -f returns once the job has ended
    failing = daemon.cli("submit", "--cmd", "exit 3", "--gpus", "1").stdout.strip()   # any program: no --app
    wait_for(lambda: daemon.polled_jobs()[-1]["state"] == "failed", 60, "the failing job")
    assert daemon.jobs()[-1]["exit_code"] == 3 and failing == str(daemon.jobs()[-1]["id"])
    # usage errors (exit 2) name the field; runtime failures (exit 1) say what failed
    bad = daemon.cli("submit", "--cmd", "true", "--app", "gpt", "--gpus", "1", check=False)
    assert bad.returncode == 2 and "app: unknown application 'gpt'" in bad.stderr
    bad = daemon.cli("submit", "--cmd", "true", "--app", "ncf", "--gpus", "2", "--min-gpus", "3", check=False)
    assert bad.returncode == 2 and "min_gpus" in bad.stderr
    bad = daemon.cli("submit", "--cmd", "true", "--gpus", "2", "--min-gpus", "1", check=False)
    assert bad.returncode == 2 and "an elastic job needs `app`" in bad.stderr
    bad = daemon.cli("cancel", "999", check=False)
    assert bad.returncode == 2 and "no job 999" in bad.stderr
    job_toml = tmp_path / "job.toml"
    job_toml.write_text('cmd = "true"\napp = "ncf"\ngpus = "four"\n')
    bad = daemon.cli("submit", str(job_toml), check=False)
    assert bad.returncode == 2 and "gpus" in bad.stderr and "Traceback" not in bad.stderr
    job_toml.write_text('cmd = "true"\napp = "ncf"\ngpus = 1\nqueue = "x"\n')
    bad = daemon.cli("submit", str(job_toml), check=False)
    assert bad.returncode == 2 and "'queue'" in bad.stderr
    (tmp_path / "forged").write_text("not-the-token\n")
    bad = daemon.cli("status", "--token-file", str(tmp_path / "forged"), check=False)
    assert bad.returncode == 1 and "bad or missing token" in bad.stderr


def test_a_second_daemon_on_the_same_state_is_refused(daemon, tmp_path):
    second = subprocess.run([*MARBLE, "serve", "--cluster", str(tmp_path / "cluster.toml"), "--state-dir",
                             str(daemon.state)], capture_output=True, text=True, timeout=60)
    assert second.returncode == 1 and "another marble daemon holds" in second.stderr


def test_no_daemon_is_a_runtime_failure(tmp_path):
    res = marble("status", "--state-dir", str(tmp_path / "none"), check=False)
    assert res.returncode == 1 and "no marble daemon found" in res.stderr


def test_forged_and_malformed_requests_are_refused_and_change_nothing(daemon, tmp_path):
    client = DaemonClient(Endpoint.resolve(daemon.state))
    for method, payload, message in [
        ("submit", {"job": ["cmd", "true"]}, "must be a table"),
        ("submit", {"job": {"cmd": "true", "app": "ncf", "gpus": 10**9}}, "gpus"),
        ("submit", {"job": {"cmd": "true", "app": "ncf", "gpus": 1, "env": {"MARBLE_JOB_ID": "7"}}}, "env"),
        ("cancel", {"job": "1; DROP TABLE marble_jobs"}, "expected a job id"),
        ("cancel", {"job": True}, "expected a job id"),
        ("logs", {"job": 1, "offset": -5}, "no job 1"),
        ("status", {"job": 2**70}, ""),
    ]:
        with pytest.raises(Exception) as caught:
            client.call(method, payload)
        assert type(caught.value).__name__ in ("UsageError", "RuntimeFailure"), caught.value
        assert message in str(caught.value)
    assert daemon.jobs() == []
    by_env = subprocess.run([*MARBLE, "queue", "--json"], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "MLSYSKIT_MARBLE_STATE_DIR": str(daemon.state)})
    assert by_env.returncode == 0 and json.loads(by_env.stdout) == []
    job = client.call("submit", {"job": {"cmd": "echo ok", "app": "ncf", "gpus": 1}})
    with pytest.raises(Exception, match="offset"):
        client.call("logs", {"job": job["id"], "offset": -5})
    wait_for(lambda: daemon.polled_jobs()[0]["state"] == "done", 60, "the job")
    assert client.call("logs", {"job": job["id"], "offset": 1 << 40})["data"] == b""


def test_tls_daemon_and_no_plain_listener_off_loopback(tmp_path):
    d = Daemon(tmp_path, "--tls")
    d.start()
    try:
        info = json.loads((d.state / "daemon.json").read_text())
        assert info["tls_ca"] and Path(info["tls_ca"]).exists()
        assert d.cli("queue", "--json").stdout.strip() == "[]"        # clients find the CA in daemon.json
        plain = d.cli("queue", "--tls-ca", "/nonexistent/ca.pem", check=False)
        assert plain.returncode == 2 and "cannot read TLS CA" in plain.stderr
    finally:
        d.stop()
    res = invoke_cli(app, ["serve", "--cluster", str(tmp_path / "cluster.toml"), "--state-dir", str(tmp_path / "s2"),
                           "--listen", "0.0.0.0:0"])        # refused before any port is taken: in-process
    assert res.exit_code == 2 and "not loopback" in res.output, res.output


def test_a_corrupt_job_table_is_a_one_line_runtime_failure(tmp_path):
    (tmp_path / "cluster.toml").write_text(CLUSTER)
    state = tmp_path / "state"
    state.mkdir()
    (state / "jobs.db").write_bytes(b"this is not a database" * 100)
    res = marble("serve", "--cluster", str(tmp_path / "cluster.toml"), "--state-dir", str(state), check=False)
    assert res.returncode == 1 and "corrupt" in res.stderr and "Traceback" not in res.stderr


def test_serve_settings_from_config_flags_win(tmp_path):
    (tmp_path / "cluster.toml").write_text(CLUSTER)
    config = tmp_path / "serve.toml"
    config.write_text(f'[serve]\ncluster = "{tmp_path / "cluster.toml"}"\npolicy = "fifo"\npoll_interval = 0.1\n')
    d = Daemon(tmp_path, "--config", str(config), "--policy", "backfill")
    d.start()
    try:
        assert DaemonClient(Endpoint.resolve(d.state)).call("info")["policy"] == "backfill"
    finally:
        d.stop()
    # settings refused before the daemon takes its state dir or a port: asked in-process
    for text, message in [('[serve]\npolicy = "lsf"\ncluster = "c.toml"\n', "policy: unknown 'lsf'"),
                          ('[serve]\ncluster = "c.toml"\nthreads = 4\n', "'threads'"),
                          ('[serve]\npolicy = "fifo"\n', "cluster: required")]:
        config.write_text(text)
        res = invoke_cli(app, ["serve", "--config", str(config), "--state-dir", str(tmp_path / "s")])
        assert res.exit_code == 2 and message in res.output, res.output
    res = invoke_cli(app, ["serve", "--cluster", str(tmp_path / "cluster.toml"), "--state-dir", str(tmp_path / "s"),
                           "--tls-cert", str(tmp_path / "none.pem"), "--tls-key", str(tmp_path / "none.key")])
    assert res.exit_code == 2 and "cannot read TLS certificate" in res.output, res.output


def test_jobs_running_across_a_daemon_kill_are_reattached_with_their_exit_codes(daemon, tmp_path):
    client = DaemonClient(Endpoint.resolve(daemon.state))
    gated = ('echo run >> {t}/{n}.runs; while [ ! -e {t}/{n}.gate ]; do sleep 0.2; done; exit {code}')
    a = client.call("submit", {"job": {"cmd": gated.format(t=tmp_path, n="a", code=3), "app": "ncf", "gpus": 1}})
    b = client.call("submit", {"job": {"cmd": gated.format(t=tmp_path, n="b", code=0), "app": "ncf", "gpus": 1}})
    wait_for(lambda: (tmp_path / "a.runs").exists() and (tmp_path / "b.runs").exists(), 60, "both jobs to run")
    daemon.kill9()
    (tmp_path / "a.gate").touch()          # a ends while no daemon is watching
    pid_a = int((daemon.state / "jobs" / str(a["id"]) / "pid").read_text())
    wait_for(lambda: not Path(f"/proc/{pid_a}").exists() or " Z " in Path(f"/proc/{pid_a}/stat").read_text(),
             30, "job a to end")
    daemon.start()
    (tmp_path / "b.gate").touch()          # b ends under the new daemon
    wait_for(lambda: {j["state"] for j in daemon.polled_jobs()} <= {"done", "failed"}, 60, "both jobs to be recorded")
    by_id = {j["id"]: j for j in daemon.jobs()}
    assert (by_id[a["id"]]["state"], by_id[a["id"]]["exit_code"]) == ("failed", 3)
    assert (by_id[b["id"]]["state"], by_id[b["id"]]["exit_code"]) == ("done", 0)
    assert (tmp_path / "a.runs").read_text() == "run\n" and (tmp_path / "b.runs").read_text() == "run\n"
