"""Start ZooKeeper 3.8 (Debian's `zookeeper` package) on loopback for tests, benchmarks and demos.

The configuration is the tested recipe of ../shared/recipes (zk_standalone.sh, zk_ensemble.sh)
with free ports instead of fixed ones, so runs do not collide: a standalone server or a
3-member ensemble, data in a caller-given directory, ready when `srvr` reports a Mode.
Every process started is stopped by `stop()` (or the context manager).
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from mlsyskit.core import net
from mlsyskit.core.errors import RuntimeFailure

JARS = ("/usr/share/java/zookeeper.jar", "/usr/share/java/slf4j-simple.jar")
INSTALL_HINT = "needs ZooKeeper 3.8 and Java: apt-get install -y zookeeper"


def available() -> bool:
    return shutil.which("java") is not None and all(Path(j).exists() for j in JARS)


def mode(port: int, timeout_s: float = 1.0) -> str | None:
    """The member's `Mode:` (standalone, leader, follower) or None while it is not serving."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as s:
            s.sendall(b"srvr")
            data = b""
            while chunk := s.recv(4096):
                data += chunk
    except OSError:
        return None
    for line in data.decode(errors="replace").splitlines():
        if line.startswith("Mode: "):
            return line[6:].strip()
    return None


class LocalZooKeeper:
    """`members` = 1 (standalone) or 3 (ensemble); `client_ports[i]`, `hosts` for kazoo."""

    def __init__(self, workdir: str | Path, members: int = 1, tick_ms: int = 200) -> None:
        if members not in (1, 3):
            raise ValueError("a local ZooKeeper has 1 or 3 members")
        if not available():
            raise RuntimeFailure(INSTALL_HINT)
        self.workdir = Path(workdir)
        ports = net.free_ports(3 * members)
        self.client_ports = ports[:members]
        self._peer_ports = ports[members:]
        self.procs: list[subprocess.Popen | None] = [None] * members
        self.tick_ms = tick_ms
        for i in range(members):
            self._write_config(i)

    @property
    def hosts(self) -> str:
        return ",".join(f"127.0.0.1:{p}" for p in self.client_ports)

    def _write_config(self, i: int) -> None:
        d = self.workdir / f"zk{i + 1}"
        (d / "data").mkdir(parents=True, exist_ok=True)
        lines = [f"tickTime={self.tick_ms}", "initLimit=10", "syncLimit=5",
                 # grant the sessions nodes ask for (failure_timeout: >= 8 heartbeats, 4 s by default) whatever the tick
                 "maxSessionTimeout=60000", f"dataDir={d / 'data'}",
                 f"clientPort={self.client_ports[i]}", "clientPortAddress=127.0.0.1",
                 "admin.enableServer=false", "4lw.commands.whitelist=ruok,srvr,stat,mntr,envi"]
        if len(self.client_ports) > 1:
            (d / "data" / "myid").write_text(f"{i + 1}\n")
            for k in range(len(self.client_ports)):
                quorum, election = self._peer_ports[2 * k], self._peer_ports[2 * k + 1]
                lines.append(f"server.{k + 1}=127.0.0.1:{quorum}:{election}")
        (d / "zoo.cfg").write_text("\n".join(lines) + "\n")

    def start_member(self, i: int) -> None:
        d = self.workdir / f"zk{i + 1}"
        with open(d / "zk.log", "ab") as log:
            self.procs[i] = subprocess.Popen(
                ["java", "-Xmx256m", "-cp", ":".join(JARS), "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
                 "org.apache.zookeeper.server.quorum.QuorumPeerMain", str(d / "zoo.cfg")],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def start(self, timeout_s: float = 60.0) -> LocalZooKeeper:
        for i in range(len(self.procs)):
            self.start_member(i)
        self.wait_serving(range(len(self.procs)), timeout_s)
        return self

    def wait_serving(self, members, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        for i in members:
            while mode(self.client_ports[i]) is None:
                proc = self.procs[i]
                if proc is None or proc.poll() is not None or time.monotonic() > deadline:
                    log = (self.workdir / f"zk{i + 1}" / "zk.log").read_text(errors="replace")[-2000:]
                    self.stop()
                    raise RuntimeFailure(f"ZooKeeper member {i + 1} did not start serving: {log}")
                time.sleep(0.05)

    def kill_member(self, i: int) -> None:
        """SIGKILL one member (a crash)."""
        proc = self.procs[i]
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        self.procs[i] = None

    def stop(self) -> None:
        for i, proc in enumerate(self.procs):
            if proc is None or proc.poll() is not None:
                continue
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill_member(i)
        self.procs = [None] * len(self.procs)

    def __enter__(self) -> LocalZooKeeper:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
