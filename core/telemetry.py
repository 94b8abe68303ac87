"""Telemetry: a JSON-lines event log, counters and histograms, resource samplers, a summary.

Every event line carries the schema version, the run id, a sequence number and a timestamp
from the injected clock, so a virtual-time simulation and a real run write the same format.
"""
from __future__ import annotations

import json
import math
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from rich.table import Table

from mlsyskit.core.clock import Clock, RealClock

SCHEMA_VERSION = 1


def percentile(values: Sequence[float], q: float, *, presorted: bool = False) -> float:
    """Nearest-rank percentile, q in [0, 100]; NaN when empty.

    The one percentile rule of the suite: every tool's p50/p99 is an observed value, the
    smallest one with at least q% of the observations at or below it.
    """
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be in [0, 100], got {q}")
    if not values:
        return math.nan
    ordered = values if presorted else sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return float(ordered[rank - 1])


@dataclass
class Histogram:
    """All observed values (exact percentiles; runs here record at most millions of points)."""

    values: list[float] = field(default_factory=list)
    _sorted: bool = True

    def observe(self, value: float) -> None:
        if self.values and value < self.values[-1]:
            self._sorted = False
        self.values.append(float(value))

    @property
    def count(self) -> int:
        return len(self.values)

    @property
    def total(self) -> float:
        return math.fsum(self.values)

    def percentile(self, q: float) -> float:
        """Nearest-rank percentile, q in [0, 100]; NaN when empty."""
        if not self._sorted:
            self.values.sort()
            self._sorted = True
        return percentile(self.values, q, presorted=True)

    def stats(self) -> dict[str, float]:
        if not self.values:
            return {"count": 0}
        return {"count": self.count, "mean": self.total / self.count, "min": self.percentile(0),
                "p50": self.percentile(50), "p90": self.percentile(90), "p99": self.percentile(99),
                "max": self.percentile(100), "sum": self.total}


class Telemetry:
    """Event log + metrics for one run. Use as a context manager or call close()."""

    def __init__(self, clock: Clock | None = None, log_path: str | Path | None = None,
                 run_id: str | None = None) -> None:
        self.clock = clock or RealClock()
        self.run_id = run_id or uuid.uuid4().hex[:12]
        self.seq = 0
        self.counters: dict[str, float] = {}
        self.histograms: dict[str, Histogram] = {}
        self._log: IO[str] | None = None
        if log_path is not None:
            path = Path(log_path)
            path.parent.mkdir(parents=True, exist_ok=True)
            self._log = path.open("a", encoding="utf-8")

    def event(self, kind: str, **fields: Any) -> dict[str, Any]:
        record = {"schema": SCHEMA_VERSION, "run_id": self.run_id, "seq": self.seq, "t": self.clock.now(),
                  "kind": kind, **fields}
        self.seq += 1
        if self._log is not None:
            # flushed per record, so a kill loses at most the record being written
            self._log.write(json.dumps(record, default=_jsonable) + "\n")
            self._log.flush()
        return record

    def count(self, name: str, n: float = 1) -> None:
        self.counters[name] = self.counters.get(name, 0) + n

    def counter(self, name: str) -> float:
        return self.counters.get(name, 0)

    def observe(self, name: str, value: float) -> None:
        self.histograms.setdefault(name, Histogram()).observe(value)

    def histogram(self, name: str) -> Histogram:
        return self.histograms.setdefault(name, Histogram())

    def summary(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "events": self.seq, "counters": dict(sorted(self.counters.items())),
                "histograms": {k: h.stats() for k, h in sorted(self.histograms.items())}}

    def summary_table(self, title: str = "summary") -> Table:
        table = Table(title=f"{title} (run {self.run_id})")
        for col in ("metric", "count", "mean", "p50", "p90", "p99", "max"):
            table.add_column(col, justify="left" if col == "metric" else "right")
        for name, value in sorted(self.counters.items()):
            table.add_row(name, _num(value), "", "", "", "", "")
        for name, hist in sorted(self.histograms.items()):
            s = hist.stats()
            if s["count"] == 0:
                continue
            table.add_row(name, _num(s["count"]), *(_num(s[k]) for k in ("mean", "p50", "p90", "p99", "max")))
        return table

    def flush(self) -> None:
        if self._log is not None:
            self._log.flush()

    def close(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> Telemetry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_events(path: str | Path) -> list[dict[str, Any]]:
    """Parse a JSONL event log, checking the schema version of each line."""
    events = []
    with Path(path).open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            record = json.loads(line)
            if record.get("schema") != SCHEMA_VERSION:
                raise ValueError(f"{path}:{lineno}: schema {record.get('schema')!r}, expected {SCHEMA_VERSION}")
            events.append(record)
    return events


class ProcessSampler:
    """CPU and memory of this process (and its children) via psutil."""

    def __init__(self, pid: int | None = None) -> None:
        import psutil

        self._proc = psutil.Process(pid)
        self._proc.cpu_percent(None)  # first call primes the counter

    def sample(self) -> dict[str, float]:
        times = self._proc.cpu_times()
        return {"cpu_percent": self._proc.cpu_percent(None), "rss_bytes": float(self._proc.memory_info().rss),
                "cpu_user_s": times.user, "cpu_system_s": times.system}


class GpuSampler:
    """Per-GPU utilisation and memory via NVML; an empty list where NVML is absent."""

    def __init__(self) -> None:
        self._nvml: Any = None
        self._handles: list[Any] = []
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        except Exception:  # no driver, no library, no device: a no-op sampler
            self._nvml = None
            self._handles = []

    @property
    def available(self) -> bool:
        return bool(self._handles)

    def sample(self) -> list[dict[str, float]]:
        out = []
        for index, handle in enumerate(self._handles):
            util = self._nvml.nvmlDeviceGetUtilizationRates(handle)
            mem = self._nvml.nvmlDeviceGetMemoryInfo(handle)
            out.append({"gpu": index, "util_percent": float(util.gpu), "mem_used_bytes": float(mem.used),
                        "mem_total_bytes": float(mem.total)})
        return out


def _num(value: float) -> str:
    if isinstance(value, float) and not value.is_integer():
        return f"{value:.4g}"
    return f"{int(value):,}"


def _jsonable(o: Any) -> Any:
    if hasattr(o, "tolist"):
        return o.tolist()
    return str(o)
