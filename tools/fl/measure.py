"""What a real client measures about itself each round and between rounds (psutil).

A `Span` brackets one piece of work: wall seconds, this process's CPU seconds, and the host's
CPU utilisation over the same interval (all cores, 0-100), from two psutil snapshots, so a busy
machine shows up even when this process is idle. Snapshots are deltas of cumulative counters:
unlike `psutil.cpu_percent()`, they keep no module-wide state that a second caller (the heartbeat)
would reset. On Linux the host's counters are read with one pread of /proc/stat on a descriptor kept
open (psutil.cpu_times() opens, buffers and parses the file each call: ~0.2 ms of CPU per snapshot on a
loaded machine, two per round on every client); elsewhere through psutil.
"""
from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass

import psutil

# /proc/stat's first line: "cpu" then user nice system idle iowait irq softirq steal guest guest_nice (ticks);
# psutil.cpu_times() returns the same ten fields in seconds, and total = their sum, as Snapshot takes it
_FIELDS = 10
_IDLE, _IOWAIT = 3, 4


class _ProcStat:
    """The host's (busy, total) CPU seconds from /proc/stat, through one descriptor per process."""

    def __init__(self) -> None:
        self._fd: int | None = None
        self._pid = -1  # a forked child opens its own
        self._lock = threading.Lock()
        self._tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

    def read(self) -> tuple[float, float] | None:
        """(busy, total) seconds, or None where /proc/stat cannot be read (not Linux)."""
        try:
            with self._lock:
                if self._fd is None or self._pid != os.getpid():
                    self._fd, self._pid = os.open("/proc/stat", os.O_RDONLY), os.getpid()
                head = os.pread(self._fd, 256, 0)
        except OSError:
            return None
        fields = head.split(b"\n", 1)[0].split()
        if not fields or fields[0] != b"cpu":
            return None
        ticks = [int(x) for x in fields[1:_FIELDS + 1]]
        total = sum(ticks)
        idle = ticks[_IDLE] + (ticks[_IOWAIT] if len(ticks) > _IOWAIT else 0)
        return (total - idle) / self._tick, total / self._tick


_proc_stat = _ProcStat()


def host_cpu_seconds() -> tuple[float, float]:
    """The host's cumulative (busy, total) CPU seconds over all cores, as psutil.cpu_times() counts them."""
    read = _proc_stat.read()
    if read is not None:
        return read
    times = psutil.cpu_times()
    total = sum(times)
    return total - (times.idle + getattr(times, "iowait", 0.0)), total


@dataclass(frozen=True)
class Snapshot:
    wall: float
    process_cpu: float
    host_busy: float
    host_total: float

    @classmethod
    def take(cls) -> Snapshot:
        busy, total = host_cpu_seconds()
        return cls(time.perf_counter(), time.process_time(), busy, total)


@dataclass(frozen=True)
class Span:
    wall_s: float
    cpu_s: float
    host_cpu_percent: float  # all cores busy over the span, 0-100; 0 when the counters did not move

    @classmethod
    def between(cls, start: Snapshot, end: Snapshot) -> Span:
        total = end.host_total - start.host_total
        busy = 100.0 * (end.host_busy - start.host_busy) / total if total > 0 else 0.0
        return cls(max(end.wall - start.wall, 0.0), max(end.process_cpu - start.process_cpu, 0.0),
                   min(max(busy, 0.0), 100.0))

    @property
    def cpu_percent(self) -> float:
        """This process's CPU over the span, as a percentage of one core."""
        return 100.0 * self.cpu_s / self.wall_s if self.wall_s > 0 else 0.0


def heartbeat_sample(since: Snapshot) -> tuple[dict[str, float], Snapshot]:
    """A heartbeat's resource fields over the interval since the last one, and the snapshot to measure from next."""
    now = Snapshot.take()
    span = Span.between(since, now)
    memory = psutil.virtual_memory()
    load1 = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    return {"host_cpu_percent": span.host_cpu_percent, "cpu_percent": span.cpu_percent,
            "memory_available_bytes": float(memory.available), "load1": float(load1),
            "cpu_count": float(psutil.cpu_count() or 1)}, now
