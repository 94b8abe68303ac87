"""Progress reports from jobs: how a real job tells the daemon its measured throughput.

A job may append lines `UNIX_TIME SAMPLES [LOSS]` (cumulative samples processed so far) to the file
named by MARBLE_PROGRESS. The daemon reads the first and the last whole lines: the measured rate is
(samples_last - samples_first) / (time_last - time_first), the policy's `measured_rate` and
`progress` for that job (as the simulator's noisy measurements are), and losses go to
`loss_reports`. Malformed lines are skipped; a job that reports nothing keeps the model's rate.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

TAIL_BYTES = 16384
MAX_LOSSES = 64


@dataclass(frozen=True)
class Progress:
    t_first: float
    s_first: float
    t_last: float
    s_last: float
    losses: tuple[tuple[float, float], ...]   # (samples, loss), most recent last

    @property
    def rate(self) -> float | None:
        dt = self.t_last - self.t_first
        return (self.s_last - self.s_first) / dt if dt > 0 and self.s_last > self.s_first else None


def _parse(line: bytes) -> tuple[float, float, float | None] | None:
    parts = line.split()
    if len(parts) not in (2, 3):
        return None
    try:
        values = [float(p) for p in parts]
    except ValueError:
        return None
    if not all(math.isfinite(v) for v in values) or values[1] < 0:
        return None
    return values[0], values[1], values[2] if len(values) == 3 else None


def read_progress(path: Path) -> Progress | None:
    try:
        with path.open("rb") as f:
            head = f.read(4096)
            size = os.fstat(f.fileno()).st_size
            f.seek(max(0, size - TAIL_BYTES))
            tail = f.read(TAIL_BYTES)
    except OSError:
        return None
    first = next((p for line in head.split(b"\n")[:-1] if (p := _parse(line))), None)
    lines = tail.split(b"\n")[:-1]                     # the last element is a partial line (or empty)
    if size > TAIL_BYTES:
        lines = lines[1:]                              # the first may be cut by the seek
    parsed = [p for line in lines if (p := _parse(line))]
    if first is None or not parsed:
        return None
    last = parsed[-1]
    losses = tuple((s, loss) for _, s, loss in parsed if loss is not None)[-MAX_LOSSES:]
    return Progress(first[0], first[1], last[0], last[1], losses)
