"""The cluster record (<data-dir>/cluster.json) and the processes it lists.

One place builds each process's command line (`process_argv`), so `up` and the supervisor
start a node, the proxy or a coordinator the same way; one place starts them (`spawn`:
detached in their own session, output appended to <data-dir>/logs/NAME.log). The record is
replaced atomically (temporary file + rename) under an advisory lock, so a reader never sees
half a record and two writers (the supervisor updating a pid, `supervise` adding itself) do
not lose each other's change.
"""
from __future__ import annotations

import fcntl
import json
import os
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlsyskit.core.config import ConfigError
from mlsyskit.tools.kv.coord.spec import CoordinatorSpec
from mlsyskit.tools.kv.ops import launcher
from mlsyskit.tools.kv.ops.coordproc import coordinator_argv

if TYPE_CHECKING:
    import psutil  # imported where used: a node process imports this module for load_record only (~0.03 s)

RECORD = "cluster.json"
ME = launcher.ENTRY


def record_path(data_dir: Path) -> Path:
    return Path(data_dir) / RECORD


def load_record(data_dir: Path) -> dict[str, Any]:
    path = record_path(data_dir)
    if not path.exists():
        raise ConfigError(f"no cluster recorded under {data_dir} (start one with `bespokv up --data-dir {data_dir}`)")
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"cannot read the cluster record {path}: {e}") from None


def write_record(data_dir: Path, record: dict[str, Any]) -> None:
    path = record_path(data_dir)
    tmp = path.with_name(f".{RECORD}.{os.getpid()}")
    tmp.write_text(json.dumps(record, indent=2))
    os.replace(tmp, path)


@contextmanager
def _locked(data_dir: Path) -> Iterator[None]:
    with open(Path(data_dir) / f".{RECORD}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def update_record(data_dir: Path, change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """Read, change in place, write back atomically, all under the record's lock."""
    with _locked(data_dir):
        record = load_record(data_dir)
        change(record)
        write_record(data_dir, record)
        return record


def process_argv(record: dict[str, Any], name: str) -> list[str]:
    """The command line of process `name` of the record: node:ID, proxy, coordinator:I, redis:ID,
    supervisor (a node runs through its host's exec prefix: placement.py)."""
    data_dir = record["data_dir"]
    kind, _, arg = name.partition(":")
    if kind == "node":
        host = record.get("placement", {}).get(arg)
        prefix = record["hosts"][host]["exec"] if host is not None else []
        return prefix + ME + ["node", arg, "--data-dir", data_dir]
    if kind == "proxy":
        return ME + ["proxy", "--data-dir", data_dir]
    if kind == "supervisor":
        return ME + ["supervise", "--data-dir", data_dir, "--foreground"]
    if kind == "coordinator":
        spec = CoordinatorSpec.from_dict(record["coordinator"])
        return coordinator_argv(spec, Path(data_dir) / "coord", int(arg))
    if kind == "redis":
        return ["redis-server", "--port", str(record["redis_ports"][arg]), "--bind", record["proxy"]["host"],
                "--dir", str(Path(data_dir) / arg / "redis"), "--save", "", "--appendonly", "yes",
                "--daemonize", "no"]
    raise ValueError(f"no process {name!r} in a bespokv cluster")


def spawn(record: dict[str, Any], name: str) -> subprocess.Popen:
    """Start process `name` detached (its own session: `down` stops its whole group)."""
    return launcher.spawn(process_argv(record, name), Path(record["data_dir"]) / "logs" / f"{name.replace(':', '-')}.log")


def strays(record: dict[str, Any]) -> list[tuple[str, int]]:
    """Live processes running this cluster's node, proxy, supervisor or coordinator command line that
    the record does not list (a node the supervisor replaced while it hung on, one started by hand
    with the same command): (name, pid), supervisors first. Matched on the arguments after the
    interpreter, so a host's exec prefix (placement.py) or the console script matches too."""
    names = ["supervisor", *(f"coordinator:{i}" for i in range(_coordinators(record))), "proxy",
             *(f"node:{n}" for n in record["map"]["nodes"])]
    tails = {name: tuple(process_argv(record, name)[len(ME) if not name.startswith("coordinator") else 1:])
             for name in names}
    import psutil

    listed = {p["pid"] for p in record.get("processes", [])} | {os.getpid()}
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmdline = tuple(proc.info["cmdline"] or ())
        name = next((n for n, tail in tails.items() if cmdline[-len(tail):] == tail), None)
        if name is not None and proc.info["pid"] not in listed:
            found.append((name, proc.info["pid"]))
    return sorted(found, key=lambda f: names.index(f[0]))


def _coordinators(record: dict[str, Any]) -> int:
    coord = record.get("coordinator")
    if not coord:
        return 0
    spec = CoordinatorSpec.from_dict(coord)
    return len(spec.addrs) if spec.kind == "embedded" else 1


def entry(name: str, pid: int) -> dict[str, Any]:
    """A record entry: the pid and its start time (a later process reusing the pid is not it)."""
    import psutil

    try:
        started = psutil.Process(pid).create_time()
    except psutil.NoSuchProcess:
        started = None
    return {"name": name, "pid": pid, "started": started}


def same_process(e: dict[str, Any]) -> psutil.Process | None:
    """The live process of a record entry, or None (gone, or its pid now names another process)."""
    import psutil

    try:
        proc = psutil.Process(e["pid"])
        if e.get("started") is not None and abs(proc.create_time() - e["started"]) > 0.01:
            return None
        return proc
    except psutil.NoSuchProcess:
        return None
