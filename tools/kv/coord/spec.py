"""Where a cluster's coordinator is and how to reach it: the CoordinatorSpec of a `--coordinator` URL.

    embedded://HOST:PORT[,HOST:PORT...]     the embedded coordinator (leader first, then standbys)
    zookeeper://HOST:PORT[,HOST:PORT...]/ROOT   ZooKeeper (liveness = a node's own session)

Its clients are built here (kazoo only when a ZooKeeper one is asked for: it is optional).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from mlsyskit.core.config import ConfigError, require
from mlsyskit.tools.kv.coord.client import CoordClient
from mlsyskit.tools.kv.coord.detector import failure_timeout
from mlsyskit.tools.kv.peerauth import read_secret


@dataclass(frozen=True)
class CoordinatorSpec:
    kind: str  # "embedded" | "zookeeper"
    addrs: tuple[tuple[str, int], ...]
    root: str = "/bespokv"
    interval_s: float = 0.5
    misses: int = 3
    secret_file: str | None = None  # the cluster secret the embedded coordinator's clients prove
    min_timeout_s: float | None = None  # the failure timeout's floor (None: 8 intervals; detector.py)

    def __post_init__(self) -> None:
        require(self.kind in ("embedded", "zookeeper"), f"unknown coordinator kind {self.kind!r}")
        require(len(self.addrs) >= 1, "a coordinator needs at least one address")
        require(self.interval_s > 0 and self.misses >= 1, "heartbeat interval > 0 and misses >= 1")

    @property
    def timeout_s(self) -> float:
        """The coordinator's failure timeout, which the nodes' leases stay within (agent.py)."""
        return failure_timeout(self.interval_s, self.misses, self.min_timeout_s)

    def url(self) -> str:
        hosts = ",".join(f"{h}:{p}" for h, p in self.addrs)
        return f"zookeeper://{hosts}{self.root}" if self.kind == "zookeeper" else f"embedded://{hosts}"

    def secret(self) -> bytes | None:
        """The cluster secret the coordinator's clients prove (embedded: the handshake; ZooKeeper:
        digest auth and ACLs); None: none configured."""
        return read_secret(self.secret_file) if self.secret_file else None

    def zookeeper(self, **options: Any) -> Any:
        """A ZkCoordinator on this spec's ensemble and root, authenticated with the cluster secret."""
        from mlsyskit.tools.kv.coord.zk import ZkCoordinator

        hosts = ",".join(f"{h}:{p}" for h, p in self.addrs)
        return ZkCoordinator(hosts, self.root, secret=self.secret(), **options)

    def embedded_client(self, timeout_s: float) -> Any:
        """A blocking client of the embedded coordinator(s), proving the cluster secret."""
        return CoordClient(list(self.addrs), timeout_s=timeout_s, secret=self.secret())

    def to_dict(self) -> dict[str, Any]:
        d = {"url": self.url(), "interval_s": self.interval_s, "misses": self.misses}
        d |= {} if self.min_timeout_s is None else {"min_timeout_s": self.min_timeout_s}
        return d | ({"secret_file": self.secret_file} if self.secret_file else {})

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CoordinatorSpec:
        spec = parse_coordinator(d["url"], float(d.get("interval_s", 0.5)), int(d.get("misses", 3)))
        return replace(spec, secret_file=d.get("secret_file"),
                       min_timeout_s=None if d.get("min_timeout_s") is None else float(d["min_timeout_s"]))


def parse_coordinator(url: str, interval_s: float = 0.5, misses: int = 3) -> CoordinatorSpec:
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in ("embedded", "zookeeper"):
        raise ConfigError(f"--coordinator wants embedded://HOST:PORT or zookeeper://HOST:PORT/ROOT, got {url!r}")
    hosts, slash, root = rest.partition("/")
    addrs = []
    for part in hosts.split(","):
        host, colon, port = part.rpartition(":")
        if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"--coordinator: bad address {part!r} in {url!r}")
        addrs.append((host, int(port)))
    return CoordinatorSpec(scheme, tuple(addrs), "/" + root if slash and root else "/bespokv", interval_s, misses)
