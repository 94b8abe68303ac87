"""`bespokv up --hosts FILE`: nodes placed on three "hosts", each a network namespace made here
(a veth pair per namespace into one bridge; the proxy and coordinator on the bridge's address).
Skips unless root with `ip netns`. Checks that each node runs inside its namespace at its host's
address, that the store works across them, and that a kill -9 of one host's node fails over."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from mlsyskit.core.config import ConfigError
from mlsyskit.core.net import free_range
from mlsyskit.tools.kv.cli_client import cluster_address, cluster_password, fetch_map
from mlsyskit.tools.kv.ops.placement import Host, place
from tests.kv.conftest import down_if_recorded
from tests.kv.test_cli import cli


def test_place_puts_replicas_of_a_shard_on_distinct_hosts() -> None:
    hosts = [Host("a", "10.0.0.1"), Host("b", "10.0.0.2"), Host("c", "10.0.0.3")]
    smap, where = place("ms-sc", "memory", 2, 3, hosts, list(range(7001, 7007)))
    for reps in smap.shards:
        assert len({where[n] for n in reps}) == 3
        assert all(smap.nodes[n].host == {"a": "10.0.0.1", "b": "10.0.0.2", "c": "10.0.0.3"}[where[n]] for n in reps)
    with pytest.raises(ConfigError, match="3 replicas per shard need at least 3 hosts"):
        place("ms-sc", "memory", 1, 3, hosts[:2], [1, 2, 3])


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


@pytest.fixture
def namespaces():
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 (ip netns) to make network namespaces")
    tag = f"{os.getpid() % 10000}"
    subnet = f"10.{200 + os.getpid() % 50}.{os.getpid() % 250}"
    bridge = f"kvbr{tag}"
    names = [f"kvh{i}-{tag}" for i in range(3)]
    made: list[str] = []
    try:
        _ip("link", "add", bridge, "type", "bridge")
        made.append("bridge")
        _ip("addr", "add", f"{subnet}.1/24", "dev", bridge)
        _ip("link", "set", bridge, "up")
        for i, ns in enumerate(names):
            _ip("netns", "add", ns)
            made.append(ns)
            outside, inside = f"kvv{i}-{tag}", f"kvi{i}-{tag}"
            _ip("link", "add", outside, "type", "veth", "peer", "name", inside)
            _ip("link", "set", inside, "netns", ns)
            _ip("link", "set", outside, "master", bridge)
            _ip("link", "set", outside, "up")
            _ip("-n", ns, "addr", "add", f"{subnet}.{11 + i}/24", "dev", inside)
            _ip("-n", ns, "link", "set", inside, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
    except (subprocess.CalledProcessError, OSError) as e:
        _teardown(bridge, names)
        pytest.skip(f"cannot make network namespaces here: {e}")
    yield f"{subnet}.1", [(ns, f"{subnet}.{11 + i}") for i, ns in enumerate(names)]
    _teardown(bridge, names)


def _teardown(bridge: str, names: list[str]) -> None:
    for ns in names:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)
    subprocess.run(["ip", "link", "del", bridge], capture_output=True, timeout=10)


@pytest.mark.slow
def test_up_with_hosts_places_nodes_in_namespaces_and_fails_over(namespaces, tmp_path: Path) -> None:
    gateway, hosts = namespaces
    hosts_file = tmp_path / "hosts.toml"
    hosts_file.write_text("".join(f'[[host]]\nname = "{ns}"\naddress = "{addr}"\nexec = ["ip", "netns", "exec", "{ns}"]\n\n'
                                  for ns, addr in hosts))
    d = str(tmp_path / "c")
    base = free_range(1 + 3)
    cli("up", "--replicas", "3", "--hosts", str(hosts_file), "--host", gateway, "--base-port", str(base),
        "--data-dir", d, "-q", "--no-supervise", timeout=120)  # the map right after the kill is checked
    try:
        record = json.loads((tmp_path / "c" / "cluster.json").read_text())
        assert record["placement"] == {"s0r0": hosts[0][0], "s0r1": hosts[1][0], "s0r2": hosts[2][0]}
        pids = {p["name"]: p["pid"] for p in record["processes"]}
        ours = os.readlink("/proc/self/ns/net")
        for i, (ns, addr) in enumerate(hosts):
            assert record["map"]["nodes"][f"s0r{i}"]["host"] == addr
            netns_inode = os.stat(f"/run/netns/{ns}").st_ino
            node_ns = os.readlink(f"/proc/{pids[f'node:s0r{i}']}/ns/net")
            assert node_ns != ours and node_ns == f"net:[{netns_inode}]"  # really inside that "host"
        cli("put", "city", "Lyon", "--data-dir", d)
        assert cli("get", "city", "--data-dir", d).stdout.strip() == "Lyon"
        os.kill(pids["node:s0r0"], 9)  # the head's host loses its node
        deadline = time.monotonic() + 30
        # polled in-process as `bespokv shardmap` asks (a CLI process per poll costs most of a CPU second)
        while fetch_map(*cluster_address(Path(d), None, None), cluster_password(Path(d), None)).epoch == 1:
            assert time.monotonic() < deadline, "no failover across hosts"
            time.sleep(0.1)
        smap = json.loads(cli("shardmap", "--data-dir", d).stdout)
        assert smap["epoch"] > 1 and smap["shards"] == [["s0r1", "s0r2"]]
        cli("put", "city", "Oslo", "--data-dir", d)
        assert cli("get", "city", "--data-dir", d).stdout.strip() == "Oslo"
    finally:
        down_if_recorded(d)
