"""`bespokv supervise`: the process that replaces a cluster's failed nodes (started by `up`).

Every heartbeat interval it looks at each node (and its redis-server), the proxy and the
coordinator processes of the record and at the coordinator's current map, and acts on
`restartpolicy.RestartPolicy`'s decision. A node whose process is gone is restarted once the coordinator has failed it over,
with the command line `up` used (record.process_argv, on its host through the host's exec
prefix) and EMPTY: its lmdb directory is moved aside to `lmdb.failed-<n>` (kept for
inspection), so it starts in recovery mode, rejoins its shard and copies the state from a
survivor (nodeproc.py, node/agent.py). A node SIGSTOPped long enough to be replaced (absent
from the map for 2 x the failure timeout) is SIGKILLed first, so it cannot resume as an old
incarnation holding the port. A node that runs but is absent from the map (partitioned) is left
alone: it rejoins by itself. A node's redis-server (redis datalet) is restarted before its node,
which fail-stopped when the store went (datalets/redis_store.py). Each restart updates the record
atomically (record.update_record) before the next decision, so `down` (which stops the supervisor
first) stops the new process.

Why empty and not the old lmdb files: every catch-up today begins with a snapshot that empties
the datalet (Reset on SNAPBEGIN), so the old files would be overwritten anyway and reusing them
would gain nothing; a catch-up that trusted their contents (a log-tail catch-up from a position)
would be unsafe, because the files carry no stream position and, with `sync=False`, are not
durable past a machine crash. A node kept in the map (the last replica of its shard: the
coordinator never fails it over) is restarted after the grace WITH its files: they are the state.

One supervisor per data directory (an exclusive lock on <data-dir>/.supervisor.lock, released
by the kernel when it dies, kill -9 included). One line per decision in <data-dir>/logs/supervisor.log.
"""
from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import psutil

from mlsyskit.core.clock import Clock, RealClock
from mlsyskit.core.config import ConfigError
from mlsyskit.core.errors import RuntimeFailure
from mlsyskit.tools.kv.client.call import call, parse_info
from mlsyskit.tools.kv.coord.spec import CoordinatorSpec
from mlsyskit.tools.kv.ops import launcher
from mlsyskit.tools.kv.ops.launcher import alive
from mlsyskit.tools.kv.ops.processes import read_password
from mlsyskit.tools.kv.ops.record import entry, load_record, same_process, spawn, update_record
from mlsyskit.tools.kv.ops.restartpolicy import Action, PolicyConfig, RestartPolicy, Seen
from mlsyskit.tools.kv.shardmap import ShardMap

SUPERVISED = ("redis:", "node:", "proxy", "coordinator:")  # a node's redis-server before the node
STOPPED = (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)


class MapSource:
    """The coordinator's current map over one kept connection (None when it does not answer)."""

    def __init__(self, spec: CoordinatorSpec) -> None:
        self.spec = spec
        self._conn: Any = None

    def __call__(self) -> ShardMap | None:
        try:
            if self._conn is None:
                self._conn = self._connect()
            return self._conn.read_map() if self.spec.kind == "zookeeper" else self._conn.map()
        except Exception:  # noqa: BLE001 - unreachable, a standby taking over, a lost session: unknown
            self.close()
            return None

    def _connect(self) -> Any:
        if self.spec.kind == "zookeeper":
            return self.spec.zookeeper(connect_timeout_s=3.0)
        return self.spec.embedded_client(timeout_s=1.0)

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except Exception:  # noqa: BLE001 - closing a broken connection
                pass
        self._conn = None


def policy_config(record: dict[str, Any]) -> PolicyConfig:
    coord = CoordinatorSpec.from_dict(record["coordinator"])
    sup = record.get("supervision", {})
    return PolicyConfig(grace_s=2 * coord.timeout_s, max_restarts=int(sup.get("max_restarts", 5)),
                        window_s=float(sup.get("window_s", 60.0)))


def give_up_line(why: str, data_dir: Path, name: str) -> str:
    """The one line a give-up leaves (after the stamp and the name): how many restarts, where the
    process's own output says why it exits, and what brings it back."""
    own_log = data_dir / "logs" / f"{name.replace(':', '-')}.log"  # record.spawn's log of that process
    return (f"GIVE UP: {why}. Why it exits: {own_log}; fix that, then `bespokv down --data-dir {data_dir}` "
            f"and `bespokv up` with the same options start it again")


class Supervisor:
    def __init__(self, data_dir: Path, clock: Clock | None = None, map_source: Any = None) -> None:
        self.data_dir = Path(data_dir).resolve()
        record = load_record(self.data_dir)
        if not record.get("coordinator"):
            raise ConfigError("this cluster runs without a coordinator: nothing fails a node over, "
                              "so there is nothing to supervise")
        self.clock = clock or RealClock()
        self.spec = CoordinatorSpec.from_dict(record["coordinator"])
        self.policy = RestartPolicy(policy_config(record))
        self.map_source = map_source or MapSource(self.spec)
        self.children: dict[int, subprocess.Popen] = {}  # what we started: reaped here
        self.last: dict[str, Action] = {}
        self.pending: dict[str, tuple[float, Path | None]] = {}  # restarted nodes not yet ready
        self.stop = [False]  # set by SIGTERM/SIGINT (serve): finish the restart in hand, then exit
        self.log_path = self.data_dir / "logs" / "supervisor.log"

    def log(self, name: str, why: str, pid: int | None = None) -> None:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + f".{int(time.time() * 1000) % 1000:03d}Z"
        with open(self.log_path, "a") as f:
            f.write(f"{stamp} {name} {why}" + (f" -> pid {pid}" if pid is not None else "") + "\n")

    def step(self) -> None:
        """One poll: observe every supervised process and the map, act on each decision."""
        for pid, child in list(self.children.items()):
            if child.poll() is not None:
                del self.children[pid]
        record = load_record(self.data_dir)
        current = self.map_source()
        watched = sorted((e for e in record.get("processes", []) if e["name"].startswith(SUPERVISED)),
                         key=lambda e: next(i for i, p in enumerate(SUPERVISED) if e["name"].startswith(p)))
        seen = {e["name"]: self._observe(e) for e in watched}
        home = ShardMap.from_dict(record["map"])
        for e in watched:
            if self.stop[0]:  # `down` is stopping us: start nothing more
                return
            name = e["name"]
            is_node = name.startswith("node:")
            in_map = None if current is None or not is_node else current.shard_of_node(name[5:]) is not None
            survivor = is_node and current is not None and any(
                seen.get(f"node:{n}") is Seen.RUNNING
                for n in current.shards[home.shard_of_node(name[5:])] if n != name[5:])
            kind, _, ident = name.partition(":")
            partner = f"redis:{ident}" if kind == "node" else f"node:{ident}" if kind == "redis" else None
            partner_running = seen.get(partner, Seen.RUNNING) is Seen.RUNNING  # a node without redis: True
            decision = self.policy.decide(name, seen[name], in_map, self.clock.now(), is_node, survivor,
                                          partner_running)
            action = decision.action
            if action.restarts:
                self._restart(record, e, action, decision.why)
            elif action is Action.GIVE_UP:
                self.log(name, give_up_line(decision.why, self.data_dir, name))
                update_record(self.data_dir, lambda r, n=name: _mark(r, n, given_up=True))
            elif action is not self.last.get(name) and action is not Action.GIVEN_UP:
                if not (action is Action.LEAVE and decision.why == "running"):
                    self.log(name, f"{action.value}: {decision.why}")
            self.last[name] = action
        self._check_replacements(record, current)

    def _check_replacements(self, record: dict[str, Any], current: ShardMap | None) -> None:
        """Log when a replacement serves (in the map, caught up, holding a lease); only then is its
        recovery marker removed (see `up`: a cluster stopped mid-copy must not start from it)."""
        for name, (since, marker) in list(self.pending.items()):
            nid = name[5:]
            if current is None or current.shard_of_node(nid) is None:
                continue
            addr = current.nodes[nid]
            try:
                info = parse_info(call(addr.host, addr.port, "INFO", timeout=0.5,
                                            password=read_password(self.data_dir)))
            except OSError:
                continue
            lease = info.get("lease_s", "-")
            if info.get("catching_up", "0") == "0" and info.get("deposed") != "1" and lease != "-" and float(lease) > 0:
                if marker is not None:
                    marker.unlink(missing_ok=True)
                del self.pending[name]
                self.log(name, f"replacement ready ({info.get('keys', '?')} keys) "
                               f"{self.clock.now() - since:.2f} s after its restart")

    def _observe(self, e: dict[str, Any]) -> Seen:
        proc = same_process(e)
        try:
            status = proc.status() if proc is not None else psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            status = psutil.STATUS_ZOMBIE
        if status == psutil.STATUS_ZOMBIE:
            return Seen.GONE
        return Seen.STOPPED if status in STOPPED else Seen.RUNNING

    def _restart(self, record: dict[str, Any], e: dict[str, Any], action: Action, why: str) -> None:
        name = e["name"]
        if action is Action.KILL_RESTART:
            self._kill(e)
        marker = None
        if name.startswith("node:") and action is not Action.RESTART_KEEP and record["datalet"] != "memory":
            marker = recovery_marker(Path(record["data_dir"]), name[5:])
            marker.write_text("replacement copying its state from a survivor\n")
            if record["datalet"] == "lmdb":
                aside = _move_aside(Path(record["data_dir"]) / name[5:] / "lmdb")  # cluster.node_datalet's path
                if aside is not None:
                    why += f"; its lmdb moved aside to {aside.name}"
        self.policy.restarted(name, self.clock.now())  # a failed start counts towards the crash-loop limit
        try:
            proc = spawn(record, name)
        except OSError as e:
            self.log(name, f"{action.value}: {why}; could not start it: {e}")
            return
        self.children[proc.pid] = proc
        if name.startswith("node:"):
            self.pending[name] = (self.clock.now(), marker)
        update_record(self.data_dir, lambda r: _replace(r, name, proc.pid))
        mode = ("empty (recovery mode)" if action is not Action.RESTART_KEEP
                else "with its data" if name.startswith("node:") else "")
        self.log(name, f"{action.value}: {why}; restarted {mode}".rstrip(), proc.pid)

    def _kill(self, e: dict[str, Any]) -> None:
        """SIGKILL the whole group (a stopped process cannot handle SIGTERM) and wait until it is gone;
        reap only what we started, through its Popen (launcher.kill)."""
        launcher.kill(self.children.get(e["pid"]) or e["pid"], gone=lambda: self._observe(e) is Seen.GONE)

    def run(self) -> None:
        """Poll every heartbeat interval until self.stop[0] (set by SIGTERM/SIGINT: never mid-restart)."""
        stop = self.stop
        while not stop[0]:
            started = self.clock.now()
            try:
                self.step()
            except (OSError, ValueError, KeyError, ConfigError) as e:  # a record being rewritten, a full disk
                self.log("supervisor", f"poll failed: {e!r}; trying again")
            while not stop[0] and self.clock.now() < started + self.spec.interval_s:
                self.clock.sleep(min(0.05, self.spec.interval_s))


def _replace(record: dict[str, Any], name: str, pid: int) -> None:
    for i, e in enumerate(record.get("processes", [])):
        if e["name"] == name:
            record["processes"][i] = {**entry(name, pid), "restarts": e.get("restarts", 0) + 1}
    for e in record.get("processes", []):
        if e["name"] == "supervisor":
            e["restarts"] = e.get("restarts", 0) + 1


def _mark(record: dict[str, Any], name: str, **fields: Any) -> None:
    for e in record.get("processes", []):
        if e["name"] == name:
            e.update(fields)


def recovery_marker(data_dir: Path, node_id: str) -> Path:
    """Present while a replacement of a node with a persistent datalet has not finished its copy."""
    return Path(data_dir) / node_id / "RECOVERING"


def _move_aside(path: Path) -> Path | None:
    if not path.exists():
        return None
    n = 1
    while (aside := path.with_name(f"{path.name}.failed-{n}")).exists():
        n += 1
    path.rename(aside)
    return aside


def serve(data_dir: Path) -> None:
    """Run the supervisor in this process until SIGTERM/SIGINT (`supervise --foreground`)."""
    data_dir = Path(data_dir).resolve()
    lock = open(data_dir / ".supervisor.lock", "a")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise RuntimeFailure(f"another supervisor already runs for {data_dir}") from None
    supervisor = Supervisor(data_dir)

    def on_signal(signum: int, frame: Any) -> None:
        supervisor.stop[0] = True
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    supervisor.log("supervisor", f"started (pid {os.getpid()}; every {supervisor.spec.interval_s:g} s)")
    try:
        supervisor.run()
    finally:
        supervisor.log("supervisor", "stopped")
        supervisor.map_source.close()
        lock.close()


def start(data_dir: Path) -> int:
    """Start a detached supervisor for a running cluster (after the last one died); its pid."""
    data_dir = Path(data_dir).resolve()
    record = load_record(data_dir)
    if not record.get("coordinator"):
        raise ConfigError("this cluster runs without a coordinator (up --coordinator none): nothing to supervise")
    if not any(e["name"].startswith("node:") for e in record.get("processes", [])):
        raise ConfigError(f"no cluster is running under {data_dir} (it was brought down)")
    old = [e for e in record["processes"] if e["name"] == "supervisor"]
    if old and same_process(old[0]) is not None and alive(old[0]["pid"]):
        raise ConfigError(f"a supervisor already runs for {data_dir} (pid {old[0]['pid']})")
    proc = spawn(record, "supervisor")

    def add(r: dict[str, Any]) -> None:
        kept = [e for e in r["processes"] if e["name"] == "supervisor"]
        r["processes"] = [e for e in r["processes"] if e["name"] != "supervisor"]
        r["processes"].append({**entry("supervisor", proc.pid),
                               "restarts": kept[0].get("restarts", 0) if kept else 0})
    update_record(data_dir, add)
    return proc.pid
