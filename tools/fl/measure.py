"""What a real client measures about itself each round and between rounds (psutil).

A `Span` brackets one piece of work: wall seconds, this process's CPU seconds, and the host's
CPU utilisation over the same interval (all cores, 0-100), from two psutil snapshots, so a busy
machine shows up even when this process is idle. Snapshots are deltas of cumulative counters:
unlike `psutil.cpu_percent()`, they keep no module-wide state that a second caller (the heartbeat)
would reset.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass

import psutil


@dataclass(frozen=True)
class Snapshot:
    wall: float
    process_cpu: float
    host_busy: float
    host_total: float

    @classmethod
    def take(cls) -> Snapshot:
        times = psutil.cpu_times()
        total = sum(times)
        idle = times.idle + getattr(times, "iowait", 0.0)
        return cls(time.perf_counter(), time.process_time(), total - idle, total)


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
