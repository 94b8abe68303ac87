"""`bespokv up --hosts FILE`: placing a cluster's nodes on several hosts.

The hosts file is TOML, one table per host:

    [[host]]
    name = "h1"
    address = "10.0.0.11"                      # where this host's nodes listen and are reached
    exec = ["ip", "netns", "exec", "h1"]       # how to start a process there ([] = this machine;
                                               # ["ssh", "h1"] for a real remote host)

Replica j of shard i goes to host (i + j) mod H, so the replicas of a shard are on distinct hosts
whenever there are at least as many hosts as replicas (refused otherwise: one host's failure
would take several replicas of a shard). The proxy and the coordinator stay on this machine at
--host, which every host must be able to reach. All hosts must see the data directory (a shared
filesystem; the tests use network namespaces of one machine).
"""
from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from mlsyskit.core.config import ConfigError
from mlsyskit.tools.kv.shardmap import NodeAddr, ShardMap


@dataclass(frozen=True)
class Host:
    name: str
    address: str
    exec: tuple[str, ...] = ()


def load_hosts(path: Path) -> list[Host]:
    try:
        data = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"cannot read the hosts file {path}: {e}") from None
    entries = data.get("host")
    if not isinstance(entries, list) or not entries:
        raise ConfigError(f"{path}: expected [[host]] tables with name, address and optional exec")
    hosts = []
    for i, entry in enumerate(entries):
        unknown = sorted(set(entry) - {"name", "address", "exec"})
        if unknown:
            raise ConfigError(f"{path}: host {i}: unknown keys {', '.join(unknown)} (valid: name, address, exec)")
        name, address, prefix = entry.get("name"), entry.get("address"), entry.get("exec", [])
        if not isinstance(name, str) or not isinstance(address, str) or not name or not address:
            raise ConfigError(f"{path}: host {i} needs a name and an address (strings)")
        if not isinstance(prefix, list) or not all(isinstance(p, str) for p in prefix):
            raise ConfigError(f"{path}: host {name}: exec must be a list of strings")
        hosts.append(Host(name, address, tuple(prefix)))
    names = [h.name for h in hosts]
    if len(set(names)) != len(names):
        raise ConfigError(f"{path}: host names repeat: {', '.join(names)}")
    return hosts


def place(controlet: str, datalet: str, shards: int, replicas: int, hosts: list[Host],
          ports: list[int]) -> tuple[ShardMap, dict[str, str]]:
    """The shard map with each node at its host's address, and node id -> host name."""
    if len(hosts) < replicas:
        raise ConfigError(f"{replicas} replicas per shard need at least {replicas} hosts, the file has {len(hosts)}")
    ids = [[f"s{s}r{r}" for r in range(replicas)] for s in range(shards)]
    nodes, where = {}, {}
    for s in range(shards):
        for r, nid in enumerate(ids[s]):
            host = hosts[(s + r) % len(hosts)]
            nodes[nid] = NodeAddr(nid, host.address, ports[s * replicas + r])
            where[nid] = host.name
    smap = ShardMap(epoch=1, controlet=controlet, datalet=datalet, shards=tuple(tuple(r) for r in ids), nodes=nodes)
    return smap, where
