"""`bespokv up/status/put/get/del/bench/down` as separate processes, lmdb across a restart, CLI errors."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys

import psutil
import pytest

from mlsyskit.core.config import ConfigError
from mlsyskit.core.net import free_range
from mlsyskit.tools.kv.ops.processes import ClusterSpec, port_free, up
from tests.conftest import VENV_BIN
from tests.kv.conftest import down_if_recorded, needs_redis

pytestmark = pytest.mark.slow  # every test here starts servers, clusters or processes

BESPOKV = [sys.executable, "-m", "mlsyskit.tools.kv.cli"]


def cli(*args: str, check: bool = True, timeout: float = 60, env: dict | None = None) -> subprocess.CompletedProcess:
    passed = {k: os.environ[k] for k in ("PYTHONPATH",) if k in os.environ}
    env = {"PATH": f"{VENV_BIN}:/usr/bin:/bin", "COLUMNS": "200", **passed, **(env or {})}
    out = subprocess.run([*BESPOKV, *args], capture_output=True, text=True, timeout=timeout, env=env)
    if check and out.returncode != 0:
        raise AssertionError(f"bespokv {' '.join(args)} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
    return out


@pytest.fixture
def cluster_dir(tmp_path):
    """A data dir whose cluster is always brought down, whatever the test did."""
    yield tmp_path / "cluster"
    down_if_recorded(tmp_path / "cluster")


def test_up_put_get_down_and_lmdb_survives_a_restart(cluster_dir) -> None:
    d = str(cluster_dir)
    base = free_range(1 + 2 * 2 * 2)
    up = ["up", "--shards", "2", "--replicas", "2", "--topology", "ms", "--consistency", "strong",
          "--datalet", "lmdb", "--base-port", str(base), "--data-dir", d,
          "--no-supervise"]  # the nodes stopped below must stay stopped (a supervisor would replace them)
    out = cli(*up)
    assert "s1r1" in out.stdout and f"127.0.0.1:{base}" in out.stderr
    assert cli("put", "city", "Lyon", "--data-dir", d).stdout.strip() == "OK"
    assert cli("put", "gone", "x", "--data-dir", d).stdout.strip() == "OK"
    assert cli("del", "gone", "--data-dir", d).stdout.strip() == "1"
    assert cli("get", "city", "--data-dir", d).stdout.strip() == "Lyon"
    missing = cli("get", "gone", "--data-dir", d, check=False)
    assert missing.returncode == 1 and "(nil)" in missing.stderr
    bench = json.loads(cli("bench", "--workload", "ycsb-a", "--keys", "100", "--ops", "400", "--clients", "4",
                           "--data-dir", d, "--json").stdout)
    assert bench["errors"] == 0 and bench["ops_per_s"] > 0
    status = json.loads(cli("status", "--data-dir", d, "--json").stdout)
    assert len(status) == 5 and all(row["up"] for row in status)
    assert {row.get("role") for row in status} == {"head", "tail", "proxy"}
    smap = json.loads(cli("shardmap", "--data-dir", d).stdout)
    assert smap["controlet"] == "ms-sc" and len(smap["shards"]) == 2

    # The proxy still answers (it serves the shard map) but the nodes are gone: a one-line error.
    record = json.loads((cluster_dir / "cluster.json").read_text())
    nodes = [psutil.Process(p["pid"]) for p in record["processes"] if p["name"].startswith("node:")]
    for n in nodes:
        n.terminate()
    psutil.wait_procs(nodes, timeout=10)
    orphaned = cli("get", "city", "--data-dir", d, "--retry-for", "0", check=False)  # no supervisor: still down
    assert orphaned.returncode == 1 and "unreachable" in orphaned.stderr and "Traceback" not in orphaned.stderr

    cli("down", "--data-dir", d)
    assert cli("status", "--data-dir", d, check=False).returncode == 1
    assert port_free("127.0.0.1", base)

    cli(*up)  # same data dir: the lmdb files are reopened
    assert cli("get", "city", "--data-dir", d).stdout.strip() == "Lyon"
    assert cli("get", "gone", "--data-dir", d, check=False).returncode == 1


def test_up_with_the_redis_datalet(cluster_dir) -> None:
    needs_redis()
    d = str(cluster_dir)
    base = free_range(1 + 2 * 3)
    cli("up", "--replicas", "3", "--topology", "aa", "--consistency", "eventual", "--datalet", "redis",
        "--base-port", str(base), "--data-dir", d)
    record = json.loads((cluster_dir / "cluster.json").read_text())
    assert sum(p["name"].startswith("redis:") for p in record["processes"]) == 3
    assert cli("put", "k", "v", "--data-dir", d).stdout.strip() == "OK"
    # aa-ec: the read may reach a replica the write has not reached yet; poll until it has (bounded).
    reads = [cli("get", "k", "--data-dir", d, check=False) for _ in range(1)]
    while reads[-1].stdout.strip() != "v" and len(reads) < 20:
        reads.append(cli("get", "k", "--data-dir", d, check=False))
    assert reads[-1].stdout.strip() == "v" and all(r.returncode in (0, 1) for r in reads)
    cli("down", "--data-dir", d)
    assert all(port_free("127.0.0.1", base + i) for i in range(7))


def test_down_stops_a_process_of_the_cluster_that_the_record_does_not_list(cluster_dir) -> None:
    """A node whose record entry was replaced while it hung on (issue 22: `down` left a node running
    after its supervisor gave up on it) is found by its command line and stopped too."""
    d = str(cluster_dir)
    cli("up", "--coordinator", "none", "--base-port", str(free_range(2)), "--data-dir", d)
    path = cluster_dir / "cluster.json"
    record = json.loads(path.read_text())
    node = next(p for p in record["processes"] if p["name"] == "node:s0r0")
    record["processes"] = [p for p in record["processes"] if p["name"] != "node:s0r0"]
    path.write_text(json.dumps(record))
    assert "stopped 2 processes" in cli("down", "--data-dir", d).stderr  # the proxy, and the unlisted node
    try:
        assert psutil.Process(node["pid"]).status() == psutil.STATUS_ZOMBIE  # gone, not yet reaped by init
    except psutil.NoSuchProcess:
        pass


def test_foreground_up_stops_the_cluster_on_ctrl_c(cluster_dir, proc_manager) -> None:
    d = str(cluster_dir)
    base = free_range(1 + 2)
    proc = proc_manager.start([*BESPOKV, "up", "--replicas", "2", "--base-port", str(base), "--data-dir", d,
                               "--foreground"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    # `up` says so once every process answered PING (EOF first means it failed).
    assert any(b"running in the foreground" in line for line in proc.stderr), "up --foreground did not start"
    status = json.loads(cli("status", "--data-dir", d, "--json").stdout)
    assert len(status) == 3 and all(row["up"] for row in status)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(30) == 0
    assert json.loads((cluster_dir / "cluster.json").read_text())["processes"] == []
    assert all(port_free("127.0.0.1", base + i) for i in range(3))


@pytest.mark.parametrize(("args", "message"), [
    (["up", "--topology", "ring"], "topology must be ms|aa"),
    (["up", "--datalet", "rocksdb"], "unknown datalet"),
    (["up", "--shards", "0"], "--shards must be"),
    (["status", "--data-dir", "/nonexistent/bespokv"], "no cluster recorded"),
    (["get", "k", "--data-dir", "/nonexistent/bespokv"], "no cluster recorded"),
    (["get", "k", "--host", "127.0.0.1"], "--host needs --port"),
    (["put", "k", "v", "--port", "70000"], "--port must be 1..65535"),
    (["bench", "--workload", "ycsb-z", "--redis", "127.0.0.1:1"], "unknown workload"),
    (["bench", "--redis", "nonsense"], "--redis wants HOST:PORT"),
])
def test_usage_errors_exit_2(args: list[str], message: str, tmp_path) -> None:
    out = cli(*args, check=False)
    assert out.returncode == 2, out
    assert message in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize(("args", "message"), [
    (["bench", "--redis", "127.0.0.1:1", "--keys", "10", "--ops", "10"], "bench against redis 127.0.0.1:1 failed"),
    (["get", "k", "--host", "127.0.0.1", "--port", "1"], "cannot reach bespokv at 127.0.0.1:1"),
    (["shardmap", "--host", "127.0.0.1", "--port", "1"], "cannot reach bespokv at 127.0.0.1:1"),
    (["get", "k", "--port", "1"], "cannot reach bespokv at 127.0.0.1:1"),
])
def test_runtime_failures_exit_1(args: list[str], message: str) -> None:
    out = cli(*args, check=False)
    assert out.returncode == 1, out
    assert message in out.stderr and "Traceback" not in out.stderr


def test_client_commands_find_the_cluster_from_the_environment(cluster_dir) -> None:
    d = str(cluster_dir)
    base = free_range(1 + 2)
    cli("up", "--replicas", "2", "--base-port", str(base), "--data-dir", d)
    env = {"MLSYSKIT_BESPOKV_ADDR": f"127.0.0.1:{base}"}
    assert cli("put", "city", "Oslo", env=env).stdout.strip() == "OK"
    assert json.loads(cli("get", "city", "--json", env=env).stdout) == {"key": "city", "value": "Oslo"}
    # --data-dir and --host/--port win over the environment; a malformed address is a usage error
    assert cli("get", "city", "--data-dir", d, env={"MLSYSKIT_BESPOKV_ADDR": "127.0.0.1:1"}).stdout.strip() == "Oslo"
    bad = cli("get", "city", check=False, env={"MLSYSKIT_BESPOKV_ADDR": "nowhere"})
    assert bad.returncode == 2 and "MLSYSKIT_BESPOKV_ADDR wants HOST:PORT" in bad.stderr
    assert json.loads(cli("del", "city", "--json", env=env).stdout) == {"key": "city", "existed": True}


def test_up_refuses_a_busy_redis_datalet_port_before_starting_anything(tmp_path) -> None:
    base = free_range(1 + 2 * 2)
    spec = ClusterSpec(replicas=2, datalet="redis", base_port=base, data_dir=tmp_path / "c")
    with socket.socket() as s:  # squat on the second node's redis port (P+1+N+1)
        s.bind(("127.0.0.1", base + 4))
        s.listen()
        with pytest.raises(ConfigError, match=f"ports already in use: 127.0.0.1:{base + 4}"):
            up(spec)
    assert not (tmp_path / "c").exists()


def test_unusable_data_dir_and_corrupt_record_are_clear_errors(tmp_path) -> None:
    out = cli("up", "--data-dir", "/dev/null/bespokv", "--base-port", str(free_range(2)), check=False)
    assert out.returncode == 2 and "cannot use --data-dir /dev/null/bespokv" in out.stderr
    (tmp_path / "cluster.json").write_text("{not json")
    out = cli("status", "--data-dir", str(tmp_path), check=False)
    assert out.returncode == 2 and "cannot read the cluster record" in out.stderr
    assert "Traceback" not in out.stderr
