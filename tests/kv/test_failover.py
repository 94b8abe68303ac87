"""`bespokv check` with failover: real node processes, a real coordinator (embedded, or ZooKeeper
where installed), kill -9 and SIGSTOP long enough to be failed over, the victims rejoining as
replacements; and a coordinator killed mid-run. Short histories (CI); the verdict must be valid
and the run must really have failed over (the coordinator committed new maps)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from mlsyskit.tools.kv.coord import zk_local
from tests.kv.test_check import cli

pytestmark = pytest.mark.slow  # every test here starts servers, clusters or processes

SHORT = ["--ops", "200", "--clients", "4", "--keys", "4", "--seed", "1", "--heartbeat", "0.2"]


def holding(tmp_path: Path, seconds: tuple[float, float]) -> list[str]:
    """A config whose faults last `seconds` (min, max): longer than the failure timeout (8 heartbeat
    intervals, coord/detector.py), so every kill or pause is failed over however fast the restart."""
    path = tmp_path / "hold.toml"
    path.write_text(f"hold = [{seconds[0]}, {seconds[1]}]\n")
    return ["--config", str(path)]


def verdict(out) -> dict:
    assert out.returncode in (0, 1), out.stderr
    result = json.loads(out.stdout)
    assert result["error"] is None, result["error"]
    assert result["outcomes"]["ok"] >= 50
    assert out.returncode == 0 and result["valid"], "\n".join(result["violations"] + result["lost"])
    return result


@pytest.mark.parametrize("mode", ["ms-sc", "ms-ec", "aa-sc", "aa-ec"])
def test_check_with_failover_passes(mode: str, tmp_path) -> None:
    out = cli("check", "--mode", mode, "--nemesis", "kill,pause", "--coordinator", "embedded", *SHORT,
              *holding(tmp_path, (2.0, 3.0)), "--out", str(tmp_path / "run"), "--json", "-q")
    result = verdict(out)
    assert {f["fault"] for f in result["faults"]} == {"kill", "pause"}
    # a kill of 2-3 s against a 1.6 s failure timeout: failed over, then rejoined (two maps each)
    assert result["reconfigurations"] >= 2
    log = (tmp_path / "run" / "cluster" / "logs" / "coordinator-0.log").read_text()
    assert "failover: epoch" in log


def test_check_survives_a_coordinator_kill(tmp_path) -> None:
    """kill -9 of the embedded coordinator: it restarts from its SQLite state at the same epoch;
    nodes keep serving meanwhile and failover works again after it."""
    out = cli("check", "--mode", "ms-sc", "--nemesis", "coordinator-kill,kill", "--coordinator", "embedded",
              *SHORT, "--out", str(tmp_path), "--json", "-q")
    result = verdict(out)
    assert {f["fault"] for f in result["faults"]} == {"coordinator-kill", "kill"}
    logs = tmp_path / "cluster" / "logs"
    restarted = [line for line in (logs / "coordinator-0.log").read_text().splitlines()
                 if line.startswith("serving")]
    kills = sum(f["fault"] == "coordinator-kill" and f["phase"] == "start" for f in result["faults"])
    assert len(restarted) == 1 + kills
    assert all(line.split()[-1] != "None" for line in restarted[1:])  # each resumed at its stored epoch


@pytest.fixture(scope="module")
def zk(tmp_path_factory):
    if not zk_local.available():
        pytest.skip(zk_local.INSTALL_HINT)
    pytest.importorskip("kazoo", reason="needs kazoo: pip install kazoo")
    with zk_local.LocalZooKeeper(tmp_path_factory.mktemp("zk")) as server:
        yield server


def test_check_with_zookeeper_failover_and_a_leader_kill(zk, tmp_path) -> None:
    """Nodes on their own ZooKeeper sessions; kill -9 of nodes (failed over, rejoined) and of the
    leading coordinator process (the standby in the leader lock takes over)."""
    out = cli("check", "--mode", "ms-sc", "--nemesis", "kill,coordinator-kill", "--coordinator",
              f"zookeeper://{zk.hosts}/check", *SHORT[:-1], "0.4", *holding(tmp_path, (4.0, 5.0)),
              "--out", str(tmp_path / "run"), "--json", "-q")  # kills outlast the 3.2 s failure timeout
    result = verdict(out)
    assert result["reconfigurations"] >= 2
    logs = sorted((tmp_path / "run" / "cluster" / "logs").glob("coordinator-*.log"))
    leading = [p.name for p in logs if "leading" in p.read_text()]
    assert len(logs) >= 3 and len(leading) >= 2  # the first leader was killed; a standby led after it


def test_up_on_zookeeper_fails_over_the_head(zk, tmp_path) -> None:
    """`bespokv up --coordinator zookeeper://...`: the map lives in ZooKeeper, nodes hold sessions;
    kill -9 of the head gives a new map (through the proxy) and writes go on."""
    import os
    import subprocess
    import time

    from mlsyskit.core.net import free_range
    from mlsyskit.tools.kv.cli_client import cluster_address, cluster_password, fetch_map
    from tests.kv.test_cli import cli as cli_checked

    d = str(tmp_path / "c")
    cli_checked("up", "--replicas", "3", "--base-port", str(free_range(4)), "--data-dir", d,
                "--coordinator", f"zookeeper://{zk.hosts}/up", "-q", "--no-supervise",
                timeout=120)  # the map right after the kill is checked; the supervisor would put s0r0 back
    try:
        cli_checked("put", "a", "1", "--data-dir", d)
        record = json.loads((tmp_path / "c" / "cluster.json").read_text())
        os.kill(next(p["pid"] for p in record["processes"] if p["name"] == "node:s0r0"), 9)
        deadline = time.monotonic() + 30
        # polled in-process as `bespokv shardmap` asks (a CLI process per poll costs most of a CPU second)
        while fetch_map(*cluster_address(Path(d), None, None), cluster_password(Path(d), None)).epoch == 1:
            assert time.monotonic() < deadline, "no failover"
            time.sleep(0.1)
        smap = json.loads(cli_checked("shardmap", "--data-dir", d).stdout)
        assert smap["epoch"] > 1 and smap["shards"] == [["s0r1", "s0r2"]]
        cli_checked("put", "b", "2", "--data-dir", d)
        assert cli_checked("get", "a", "--data-dir", d).stdout.strip() == "1"
    finally:
        try:
            cli_checked("down", "--data-dir", d, check=False)
        except subprocess.TimeoutExpired:   # on a loaded machine: nothing the record lists outlives the test
            for proc in json.loads((tmp_path / "c" / "cluster.json").read_text())["processes"]:
                try:
                    os.kill(proc["pid"], 9)
                except ProcessLookupError:
                    pass
            raise
