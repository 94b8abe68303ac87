"""`bespokv up/down/status`: a cluster as separate processes on loopback, recorded on disk.

Layout for base port P with N = shards x replicas nodes: the proxy listens on P, node i on
P+1+i, and (datalet redis) node i's redis-server on P+1+N+i. The record
(<data-dir>/cluster.json, record.py) holds the shard map, the datalet options and every process
id, so `down` and `status` need nothing but the data directory. With a coordinator, `up` also
starts a supervisor (supervisor.py) that restarts a node whose process died once it was failed
over; `down` stops the supervisor first, so nothing is restarted behind it.
"""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlsyskit.core.clock import Clock, RealClock
from mlsyskit.core.config import ConfigError, require
from mlsyskit.core.net import port_is_free
from mlsyskit.tools.kv.client.call import call, parse_info
from mlsyskit.tools.kv.controlets import controlet_class
from mlsyskit.tools.kv.coord.spec import CoordinatorSpec
from mlsyskit.tools.kv.datalets import DATALETS
from mlsyskit.tools.kv.ops import coordproc, launcher
from mlsyskit.tools.kv.ops.launcher import alive
from mlsyskit.tools.kv.ops.placement import load_hosts, place
from mlsyskit.tools.kv.ops.record import (
    entry,
    load_record,
    record_path,
    same_process,
    spawn,
    strays,
    write_record,
)
from mlsyskit.tools.kv.peerauth import load_or_create_secret
from mlsyskit.tools.kv.shardmap import ShardMap, layout

__all__ = ["load_record", "record_path"]  # re-exported: nodeproc and others read the record from here
PASSWORD_FILE = "requirepass"


@dataclass(frozen=True)
class ClusterSpec:
    shards: int = 1
    replicas: int = 1
    controlet: str = "ms-sc"
    datalet: str = "memory"
    host: str = "127.0.0.1"
    base_port: int = 7000
    data_dir: Path = Path(".bespokv")
    coordinator: str = "embedded"  # none | embedded | zookeeper://HOST:PORT[,...]/ROOT
    hosts: Path | None = None  # TOML hosts file: nodes placed on several hosts (placement.py)
    heartbeat: float = 0.5  # seconds between a node's heartbeats; failed over after `misses` missed
    misses: int = 3
    requirepass: str | None = None  # clients must AUTH; kept in <data-dir>/requirepass (0600), never in argv
    supervise: bool = True  # with a coordinator: a supervisor restarts failed-over nodes (supervisor.py)
    max_restarts: int = 5  # the supervisor's crash-loop limit: restarts of one process ...
    restart_window: float = 60.0  # ... per this many seconds

    def __post_init__(self) -> None:
        require(self.coordinator in ("none", "embedded") or self.coordinator.startswith("zookeeper://"),
                f"--coordinator must be none, embedded or zookeeper://HOST:PORT/ROOT, got {self.coordinator!r}")
        require(self.requirepass is None or (0 < len(self.requirepass) <= 512 and "\n" not in self.requirepass),
                "--requirepass must be 1..512 characters on one line")
        require(self.max_restarts >= 1 and self.restart_window > 0,
                "--max-restarts must be at least 1 and --restart-window positive")
        require(self.heartbeat > 0 and self.misses >= 1, "--heartbeat must be positive, misses at least 1")
        require(1 <= self.shards <= 64, f"--shards must be 1..64, got {self.shards}")
        require(1 <= self.replicas <= 9, f"--replicas must be 1..9, got {self.replicas}")
        controlet_class(self.controlet)
        require(self.datalet in DATALETS, f"unknown datalet {self.datalet!r}; choose from {sorted(DATALETS)}")
        n = self.shards * self.replicas
        require(1024 <= self.base_port and self.base_port + 1 + 2 * n < 65536,
                f"--base-port {self.base_port} leaves no room for {n} nodes below 65536")


def password_path(data_dir: Path) -> Path:
    return Path(data_dir) / PASSWORD_FILE


def write_password(data_dir: Path, password: str | None) -> None:
    """<data-dir>/requirepass, mode 0600 from creation (replaced atomically); removed without one."""
    path = password_path(data_dir)
    if password is None:
        path.unlink(missing_ok=True)
        return
    tmp = path.with_name(f".{PASSWORD_FILE}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(password.encode())  # UTF-8 whatever the locale, as the CLI sends it
    os.replace(tmp, path)


def read_password(data_dir: Path) -> bytes | None:
    """The cluster's client password (None: the cluster has none)."""
    try:
        return password_path(data_dir).read_bytes()
    except FileNotFoundError:
        return None


def port_free(host: str, port: int) -> bool:
    """Whether a server could listen on host:port now (SO_REUSEADDR, as the servers bind)."""
    return port_is_free(port, host, reuse_addr=True)


def plan(spec: ClusterSpec) -> dict[str, Any]:
    n = spec.shards * spec.replicas
    node_ports = [spec.base_port + 1 + i for i in range(n)]
    hosts: dict[str, Any] = {}
    where: dict[str, str] = {}
    if spec.hosts is not None:
        if spec.datalet == "redis":
            raise ConfigError("--hosts places memory and lmdb nodes; the redis datalet is not placed on hosts yet")
        found = load_hosts(spec.hosts)
        smap, where = place(spec.controlet, spec.datalet, spec.shards, spec.replicas, found, node_ports)
        hosts = {h.name: {"address": h.address, "exec": list(h.exec)} for h in found}
    else:
        smap = layout(spec.controlet, spec.datalet, spec.shards, spec.replicas, spec.host, node_ports)
    node_ids = [nid for reps in smap.shards for nid in reps]
    redis = ({nid: spec.base_port + 1 + n + i for i, nid in enumerate(node_ids)}
             if spec.datalet == "redis" else {})
    return {"map": smap.to_dict(), "datalet": spec.datalet, "data_dir": str(Path(spec.data_dir).resolve()),
            "proxy": {"host": spec.host, "port": spec.base_port}, "redis_ports": redis, "processes": [],
            "hosts": hosts, "placement": where}


def up(spec: ClusterSpec, clock: Clock | None = None, timeout: float = 30.0) -> dict[str, Any]:
    """Start every process, wait until each answers PING, and write the record."""
    clock = clock or RealClock()
    data_dir = Path(spec.data_dir).resolve()
    if record_path(data_dir).exists():
        old = load_record(data_dir)
        if any(alive(p["pid"]) for p in old.get("processes", [])):
            raise ConfigError(f"a cluster is already running under {data_dir}; run `bespokv down` first")
    record = plan(spec)
    interrupted = [n for n in record["map"]["nodes"] if (data_dir / n / "RECOVERING").exists()]
    if interrupted and spec.datalet != "memory":
        raise ConfigError(f"{', '.join(interrupted)} stopped while a replacement was copying its state from a "
                          f"survivor (supervisor.py): its files under {data_dir} may be partial, and a shard "
                          f"starting together may copy from them. Its previous files are in lmdb.failed-<n>; "
                          f"restore or delete the partial copy, then remove its RECOVERING file")
    endpoints = _endpoints(record)
    redis_endpoints = [("redis", spec.host, p) for p in record["redis_ports"].values()]
    local = [e for e in endpoints + redis_endpoints if e[0] not in record["placement"]]  # others: not ours to probe
    busy = [f"{h}:{p}" for _, h, p in local if not port_free(h, p)]
    if busy:
        raise ConfigError(f"ports already in use: {', '.join(busy)} (pick another --base-port)")
    if record["redis_ports"] and shutil.which("redis-server") is None:
        raise ConfigError("the redis datalet needs redis-server: apt-get install -y redis-server")
    try:
        (data_dir / "logs").mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"cannot use --data-dir {data_dir}: {e.strerror}") from None
    password = spec.requirepass.encode() if spec.requirepass is not None else None
    coord = coordproc.spec_for_up(spec.coordinator, spec.host, spec.heartbeat, spec.misses, data_dir)
    try:
        if coord is not None:
            record["coordinator"] = coord.to_dict()
            for i in range(len(coord.addrs) if coord.kind == "embedded" else 1):
                _spawn(record, f"coordinator:{i}")
        for nid in record["redis_ports"]:
            (data_dir / nid / "redis").mkdir(parents=True, exist_ok=True)
            _spawn(record, f"redis:{nid}")
        _wait_ready(record, redis_endpoints, clock, timeout, None)  # redis datalets: no password
        write_record(data_dir, record)
        write_password(data_dir, spec.requirepass)  # before the nodes start: they read it
        load_or_create_secret(data_dir)  # the nodes' peer-authentication secret, mode 0600
        for reps in record["map"]["shards"]:
            for nid in reps:
                _spawn(record, f"node:{nid}")
        _spawn(record, "proxy")
        write_record(data_dir, record)
        _wait_ready(record, endpoints, clock, timeout, password)
        if coord is not None:
            coordproc.initialize(coord, ShardMap.from_dict(record["map"]), clock, timeout)
            coordproc.wait_leases(_endpoints(record), clock, timeout, record['data_dir'], password)
            if spec.supervise:  # last: nothing it could restart is still starting
                record["supervision"] = {"max_restarts": spec.max_restarts, "window_s": spec.restart_window}
                _spawn(record, "supervisor")
                write_record(data_dir, record)
    except BaseException:
        down(data_dir)
        raise
    return record


def _endpoints(record: dict[str, Any]) -> list[tuple[str, str, int]]:
    smap = record["map"]
    out = [(nid, a["host"], a["port"]) for nid, a in smap["nodes"].items()]
    out.append(("proxy", record["proxy"]["host"], record["proxy"]["port"]))
    return out


def _spawn(record: dict[str, Any], name: str) -> None:
    record["processes"].append(entry(name, spawn(record, name).pid))


def _wait_ready(record: dict[str, Any], endpoints: list, clock: Clock, timeout: float,
                password: bytes | None) -> None:
    """launcher.wait_ready, failing at once when a recorded process exited."""
    launcher.wait_ready(endpoints, clock=clock, timeout=timeout, password=password, error=ConfigError,
                        logs=f"{record['data_dir']}/logs",
                        exited=lambda: [p["name"] for p in record["processes"] if not alive(p["pid"])])


def down(data_dir: Path, clock: Clock | None = None, grace: float = 5.0) -> list[str]:
    """SIGTERM every recorded process group (SIGKILL after `grace`), then every process running one of
    the cluster's command lines that the record does not list (record.strays); returns what was stopped.

    The supervisor first, and the record read again after it exited: it may have just replaced a
    node (it finishes a restart, records the new pid, then exits on SIGTERM)."""
    clock = clock or RealClock()
    record = load_record(Path(data_dir))
    stopped = []
    for p in record.get("processes", []):
        if p["name"] == "supervisor" and same_process(p) is not None:
            launcher.stop([p["pid"]], clock, grace)
            stopped.append(p["name"])
            record = load_record(Path(data_dir))
    procs = [p for p in record.get("processes", []) if p["name"] != "supervisor" and alive(p["pid"])]
    # The coordinator first (nodes going quiet must not look like failures), then the proxy and
    # nodes, then their redis datalets.
    coordinators = [p["pid"] for p in procs if p["name"].startswith("coordinator")]
    launcher.stop(coordinators, clock, grace)
    launcher.stop([p["pid"] for p in reversed(procs) if p["pid"] not in coordinators], clock, grace)
    stopped += [p["name"] for p in procs]
    unlisted = strays(record)  # found by their command lines: whoever started them, they are this cluster's
    launcher.stop([pid for _, pid in unlisted], clock, grace)
    stopped += [f"{name} (pid {pid}, not in the record)" for name, pid in unlisted]
    record["processes"] = []
    write_record(Path(data_dir), record)
    return stopped


def status(data_dir: Path) -> list[dict[str, Any]]:
    record = load_record(Path(data_dir))
    password = read_password(Path(data_dir))
    entries = {p["name"]: p for p in record.get("processes", [])}
    rows = []
    for name, host, port in _endpoints(record):
        e = entries.get(f"node:{name}", entries.get(name, {}))
        row: dict[str, Any] = {"name": name, "endpoint": f"{host}:{port}", "pid": e.get("pid"), "up": False,
                               "restarts": e.get("restarts", 0)}
        if e.get("given_up"):
            row["state"] = "given up (crash loop)"
        try:
            info = parse_info(call(host, port, "INFO", password=password))
            row.update(up=True, role=info.get("role", "proxy"), commands=int(info.get("total_commands", 0)),
                       keys=info.get("keys", "-"), epoch=info.get("epoch", "-"), state=_node_state(info))
            if e.get("given_up"):
                row["state"] += "; supervisor gave up on it"
        except OSError:
            pass
        rows.append(row)
    return rows


def store_status(data_dir: Path) -> list[dict[str, Any]]:
    """The nodes' redis-servers (redis datalet) for `bespokv status`: pid, up, restarts."""
    record = load_record(Path(data_dir))
    rows = []
    for e in record.get("processes", []):
        if e["name"].startswith("redis:"):
            nid = e["name"][6:]
            up = same_process(e) is not None and alive(e["pid"])
            rows.append({"node": nid, "endpoint": f"{record['proxy']['host']}:{record['redis_ports'][nid]}",
                         "pid": e["pid"], "up": up, "restarts": e.get("restarts", 0)})
    return rows


def coordinator_status(data_dir: Path) -> dict[str, Any] | None:
    """The coordinator's line for `bespokv status` (None: the cluster runs without one)."""
    record = load_record(Path(data_dir))
    if not record.get("coordinator"):
        return None
    pids = {p["name"]: p["pid"] for p in record.get("processes", [])}
    return coordproc.status_row(CoordinatorSpec.from_dict(record["coordinator"]), pids.get("coordinator:0"))


def supervisor_status(data_dir: Path) -> dict[str, Any] | None:
    """The supervisor's line for `bespokv status` (None: the cluster has none)."""
    found = [p for p in load_record(Path(data_dir)).get("processes", []) if p["name"] == "supervisor"]
    if not found:
        return None
    e = found[0]
    up = same_process(e) is not None and alive(e["pid"])
    return {"pid": e["pid"], "up": up, "restarts": e.get("restarts", 0),
            "state": "supervising" if up else f"NOT RUNNING: restart it with `bespokv supervise --data-dir {data_dir}`"}


def _node_state(info: dict[str, str]) -> str:
    """ready | catching up (keys copied so far, from whom) | deposed (rejoining) | no lease."""
    if info.get("role") == "learner":  # a replacement copying before it joins (controlets/learner.py)
        return f"copying: {info.get('sync_keys', '0')} keys from {info.get('sync_source', '-')} (learner)"
    if info.get("deposed") == "1":
        return "deposed: rejoining"
    if info.get("catching_up", "0") != "0":
        return f"catching up: {info.get('sync_keys', '0')} keys from {info.get('sync_source', '-')}"
    lease = info.get("lease_s", "-")
    if lease != "-" and float(lease) <= 0:
        return "no lease"
    return "ready"
