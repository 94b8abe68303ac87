"""The daemon as a Slurm user meets it, with real processes: `marble serve` (default policy, local
executor, nodes of 4 + 2 + 2 logical GPUs, users with their own tokens, --max-time 10:00) and the
`marble` client commands as subprocesses. Exact GPU counts, mixed-node admission, pending reasons,
wall time, dependencies, arrays, users, cancel, history, compact tables, 50 concurrent submits."""
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from test_daemon import MARBLE, Daemon, kill_leftover_jobs, wait_for

from mlsyskit.tools.sched.daemon.client import DaemonClient, Endpoint
from mlsyskit.tools.sched.daemon.users import add_user
from mlsyskit.tools.sched.policies import DEFAULT_POLICY

pytestmark = pytest.mark.slow   # a daemon and its jobs are real processes

CLUSTER = "".join(f'[[nodes]]\nname = "{n}"\ngpus = {g}\nlogical = true\n\n' for n, g in
                  (("big", 4), ("s1", 2), ("s2", 2)))
# A job that records what it was given, then waits for its gate file.
GATED = ('echo "$MARBLE_JOB_ID $MARBLE_GPUS $CUDA_VISIBLE_DEVICES ${{MARBLE_ARRAY_TASK_ID:--}} $(date +%s.%N)" '
         '>> {t}/ran; while [ ! -e {t}/{gate} ]; do sleep 0.2; done; echo "end $MARBLE_JOB_ID $(date +%s.%N)" '
         '>> {t}/ran')


class Cluster:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.users = tmp / "users.toml"
        self.tokens = {name: tmp / f"{name}.token" for name in ("alice", "bob")}
        add_user(self.users, "alice", self.tokens["alice"], admin=True)
        add_user(self.users, "bob", self.tokens["bob"], admin=False)
        self.daemon = Daemon(tmp, "--users", str(self.users), "--max-time", "10:00")
        (tmp / "cluster.toml").write_text(CLUSTER)
        self.state = self.daemon.state

    def client(self, user: str) -> DaemonClient:
        return DaemonClient(Endpoint.resolve(self.state, user_token_file=self.tokens[user]))

    def cli(self, user: str | None, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
        extra = {"MLSYSKIT_MARBLE_STATE_DIR": str(self.state), "COLUMNS": "80", **(env or {})}
        if user:
            extra["MLSYSKIT_MARBLE_USER_TOKEN_FILE"] = str(self.tokens[user])
        return subprocess.run([*MARBLE, *args], capture_output=True, text=True, timeout=240,
                              env={**os.environ, **extra})

    def submit(self, user: str, gate: str, **job) -> dict:
        cmd = GATED.format(t=self.tmp, gate=gate)
        return self.client(user).call("submit", {"job": {"cmd": cmd, "app": "ncf", **job}})

    def job(self, job_id: int) -> dict:
        return self.client("alice").call("status", {"job": job_id})["jobs"][0]

    def ran(self) -> dict[int, dict]:
        runs: dict[int, dict] = {}
        path = self.tmp / "ran"
        for line in path.read_text().splitlines() if path.exists() else []:
            parts = line.split()
            if parts[0] == "end":
                runs[int(parts[1])]["end"] = float(parts[2])
            else:
                runs[int(parts[0])] = {"gpus": int(parts[1]), "visible": parts[2].split(","), "task": parts[3],
                                       "start": float(parts[4]), "end": None}
        return runs

    def idle(self) -> bool:
        return not self.client("alice").call("queue")["jobs"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("slurmlike"))
    c.daemon.start()
    yield c
    c.daemon.stop()
    kill_leftover_jobs(c.state)


def one_line(text: str) -> str:
    return " ".join(text.split())


def test_exact_counts_mixed_node_admission_and_no_blocking(cluster):
    assert cluster.client("alice").call("info")["policy"] == DEFAULT_POLICY
    for args, message in [
        (["--gpus", "8", "--min-gpus", "8", "--nodes", "1"],
         "requested configuration is not available: 8 GPUs on one node; largest node has 4"),
        (["--gpus", "9"], "requested configuration is not available: gpus: 9 is more GPUs than the cluster has (8)"),
    ]:
        res = cluster.cli("bob", "submit", "--cmd", "true", "--app", "ncf", *args)
        assert res.returncode == 2 and message in one_line(res.stderr) and "Traceback" not in res.stderr, res.stderr
    eight = cluster.submit("bob", "g8", gpus=8, min_gpus=8, name="eight")
    # the others only once it runs: submitted in the same scheduling pass, the policy may start them first
    # (a legitimate order), and the test's gates would then hold every GPU for ever
    wait_for(lambda: eight["id"] in cluster.ran(), 120, "the 8-GPU job to start")
    six = cluster.submit("bob", "g6", gpus=6, name="six")
    elastic = cluster.submit("bob", "g6", gpus=4, min_gpus=1, name="elastic")
    assert cluster.ran()[eight["id"]]["gpus"] == 8 and len(set(cluster.ran()[eight["id"]]["visible"])) == 8
    wait_for(lambda: cluster.job(six["id"])["pending"] == "Resources", 60, "the 6-GPU job's reason")
    (cluster.tmp / "g8").touch()
    wait_for(lambda: {six["id"], elastic["id"]} <= set(cluster.ran()), 120, "the next jobs to start")
    runs = cluster.ran()
    assert runs[six["id"]]["gpus"] == 6, "exact: --gpus 6 runs on 6, not on what the policy would pick"
    assert 1 <= runs[elastic["id"]]["gpus"] <= 2, "elastic (--min-gpus 1) on what was left of 8"
    (cluster.tmp / "g6").touch()
    wait_for(cluster.idle, 120, "the cluster to drain")


def test_pending_reasons_dependencies_and_wall_time(cluster):
    hog = cluster.submit("alice", "h", gpus=8, name="hog")
    wait_for(lambda: hog["id"] in cluster.ran(), 120, "the hog to start")
    waits = cluster.submit("alice", "h2", gpus=2, name="waits")
    behind = cluster.submit("alice", "h2", gpus=1, name="behind")
    after = cluster.submit("alice", "h2", gpus=1, name="after", dependency=f"afterok:{hog['id']}")
    too_long = cluster.submit("alice", "h2", gpus=1, name="toolong", time="20:00")
    failing = cluster.client("alice").call("submit", {"job": {"cmd": "exit 4", "app": "ncf", "gpus": 1}})
    never = cluster.submit("alice", "h2", gpus=1, name="never", dependency=f"afterok:{failing['id']}")
    want = {waits["id"]: "Resources", behind["id"]: "Priority", after["id"]: "Dependency",
            too_long["id"]: "QOSMaxWall"}
    wait_for(lambda: {i: cluster.job(i)["pending"] for i in want} == want, 60, "the pending reasons")
    table = cluster.cli("alice", "queue").stdout
    for reason in want.values():
        assert f"({reason})" in table, table
    (cluster.tmp / "h").touch()
    wait_for(lambda: cluster.job(never["id"])["state"] == "cancelled", 120, "the broken dependency")
    assert cluster.job(never["id"])["reason"].startswith(f"DependencyNeverSatisfied: job {failing['id']} ended failed")
    wait_for(lambda: after["id"] in cluster.ran(), 120, "the dependent job to start")
    runs = cluster.ran()
    assert runs[after["id"]]["start"] >= runs[hog["id"]]["end"], "afterok started before its dependency ended"
    res = cluster.cli("alice", "cancel", "--name", "toolong")
    assert res.returncode == 0 and cluster.job(too_long["id"])["state"] == "cancelled"
    (cluster.tmp / "h2").touch()
    limited = cluster.client("alice").call("submit", {"job": {"cmd": "exec sleep 300", "app": "ncf", "gpus": 1,
                                                              "time": "0:02"}})
    wait_for(lambda: cluster.job(limited["id"])["state"] == "timeout", 120, "the wall-time limit")
    ended = cluster.job(limited["id"])
    assert ended["reason"].startswith("TimeLimit") and 2.0 <= ended["ended"] - ended["started"] < 60
    wait_for(cluster.idle, 120, "the cluster to drain")


def test_arrays_users_cancel_and_history(cluster):
    array = cluster.cli("bob", "submit", "--cmd", GATED.format(t=cluster.tmp, gate="a"), "--app", "ncf",
                        "--gpus", "1", "--array", "0-4", "--name", "sweep")
    assert array.returncode == 0, array.stderr
    ids = [int(line) for line in array.stdout.split()]
    assert len(ids) == 5 and ids == list(range(ids[0], ids[0] + 5))
    after_all = cluster.submit("bob", "a", gpus=1, name="gather", dependency=f"afterok:{ids[0]}")
    wait_for(lambda: set(ids) <= set(cluster.ran()), 120, "the array's tasks to run")
    assert sorted(cluster.ran()[i]["task"] for i in ids) == ["0", "1", "2", "3", "4"]
    wait_for(lambda: cluster.job(after_all["id"])["pending"] == "Dependency", 60, "the gather job's reason")
    # users: a call without a token, or with a forged one, is refused; bob may not cancel alice's job
    assert "serves its users only" in one_line(cluster.cli(None, "queue").stderr)
    (cluster.tmp / "forged").write_text("not-a-token\n")
    forged = cluster.cli(None, "queue", "--user-token-file", str(cluster.tmp / "forged"))
    assert forged.returncode == 1 and "no valid user token" in one_line(forged.stderr)
    mine = cluster.submit("alice", "a", gpus=1, name="alices")
    res = cluster.cli("bob", "cancel", str(mine["id"]))
    assert res.returncode == 2 and f"job {mine['id']} belongs to alice" in one_line(res.stderr)
    res = cluster.cli("bob", "logs", str(mine["id"]))
    assert res.returncode == 2 and "output is alice's" in one_line(res.stderr)
    res = cluster.cli("bob", "cancel", "--user", "alice")
    assert res.returncode == 2 and "may not cancel the jobs of alice" in one_line(res.stderr)
    res = cluster.cli("bob", "cancel", str(ids[3]), str(ids[4]))
    assert res.returncode == 0, res.stderr
    res = cluster.cli("alice", "cancel", "--user", "bob")          # an admin cancels the rest of bob's
    assert res.returncode == 0, res.stderr
    res = cluster.cli("alice", "cancel", str(mine["id"]))
    assert res.returncode == 0, res.stderr
    wait_for(cluster.idle, 120, "the cancels")
    states = {i: cluster.job(i)["state"] for i in [*ids, after_all["id"], mine["id"]]}
    assert set(states.values()) == {"cancelled"}, states
    history = json.loads(cluster.cli("alice", "history", "--user", "bob", "--json").stdout)
    assert {j["user"] for j in history} == {"bob"} and set(ids) <= {j["id"] for j in history}
    for j in history:
        if j["started"] is not None:
            assert j["wait_s"] >= 0 and j["run_s"] >= 0 and j["ended"] >= j["started"] >= j["submitted"]
    text = cluster.cli("alice", "history").stdout.splitlines()
    assert text[0].split() == ["ID", "USER", "NAME", "STATE", "GPUS", "SUBMIT", "START", "END", "WAIT", "RUN", "EXIT",
                               "REASON"]
    assert any(line.split()[1:4] == ["bob", "sweep[0]", "cancelled"] for line in text[1:])


def test_fifty_concurrent_submits_succeed_and_tables_stay_one_line_per_job(cluster):
    long_name = "a-long-job-name-" * 8
    gate = cluster.submit("alice", "f", gpus=1, name="gate")      # the 50 wait for it: none needs to run
    before = len(cluster.client("alice").call("status")["jobs"])

    def submit(i: int) -> subprocess.CompletedProcess:
        return cluster.cli("bob" if i % 2 else "alice", "submit", "--cmd", "true", "--app", "ncf", "--gpus",
                           str(1 + i % 4), "--name", f"{long_name}{i}", "--time", "5:00", "--dependency",
                           f"afterok:{gate['id']}")

    t0 = time.monotonic()
    with ThreadPoolExecutor(50) as pool:
        results = list(pool.map(submit, range(50)))
    elapsed = time.monotonic() - t0
    failed = [r.stderr for r in results if r.returncode != 0]
    assert not failed, f"{len(failed)} of 50 failed ({elapsed:.0f} s, load {os.getloadavg()[0]:.1f}): {failed[:2]}"
    ids = sorted(int(r.stdout) for r in results)
    assert len(set(ids)) == 50
    jobs = cluster.client("alice").call("status")["jobs"]
    assert len(jobs) == before + 50
    table = cluster.cli("alice", "status").stdout.splitlines()
    assert len(table) == 1 + before + 50, "one header and one line per job: never a vertical layout"
    assert all(len(line) <= 80 for line in table), max(table, key=len)
    assert any("…" in line for line in table), "long names are cut with an ellipsis"
    assert f"{long_name}7" in {j["name"] for j in jobs}, "the daemon keeps the whole name (as --json shows it)"
    results = cluster.client("alice").call("cancel", {"jobs": ids})["results"]
    assert [r["error"] for r in results] == [None] * 50
    (cluster.tmp / "f").touch()
    wait_for(cluster.idle, 120, "the cancels")


def test_serve_help_and_a_busy_port(cluster, tmp_path):
    helped = subprocess.run([*MARBLE, "serve", "--help"], capture_output=True, text=True, timeout=60)
    text = one_line(helped.stdout)
    assert "not carried out on real jobs" not in text and "carried out where the executor can restart jobs" in text
    address = json.loads((cluster.state / "daemon.json").read_text())["address"]
    busy = subprocess.run([*MARBLE, "serve", "--cluster", str(cluster.tmp / "cluster.toml"), "--state-dir",
                           str(tmp_path / "other"), "--listen", address], capture_output=True, text=True, timeout=60)
    assert busy.returncode == 1 and busy.stderr.startswith(f"error: cannot listen on {address}"), busy.stderr
    assert one_line(busy.stderr).count("error:") == 1 and "E0000" not in busy.stderr and "chttp2" not in busy.stderr


def test_client_commands_load_no_daemon_machinery():
    """What a client command imports: no policy, simulator, model, job table, numpy or rich."""
    code = ("import sys; import mlsyskit.tools.sched.cli_app; "
            "print(','.join(m for m in ('mlsyskit.tools.sched.policies', 'mlsyskit.tools.sched.simulator', "
            "'mlsyskit.tools.sched.throughput', 'mlsyskit.tools.sched.daemon.scheduler', "
            "'mlsyskit.tools.sched.daemon.specs', 'numpy', 'rich') if m in sys.modules))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and res.stdout.strip() == "", res.stdout + res.stderr
