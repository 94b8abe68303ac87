"""Compact job tables for `status`, `queue` and `history`, as squeue and sacct print them: one line
per job whatever the text, long cells cut with an ellipsis (the whole text is in --json), never a
vertical layout. Plain text (no rich): these commands must answer fast."""
from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Sequence

ELLIPSIS = "…"


def fit_widths(columns: Sequence[tuple[str, int]], rows: list[list[str]], width: int) -> list[int]:
    """Each column as wide as its widest cell, then the flexible ones (min width > 0) narrowed, widest
    first, until the line fits `width` or none can shrink further."""
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, (h, _) in enumerate(columns)]
    mins = [max(len(h), m) if m else w for (h, m), w in zip(columns, widths, strict=True)]
    while sum(widths) + 2 * (len(widths) - 1) > width:
        shrinkable = [i for i, w in enumerate(widths) if w > mins[i]]
        if not shrinkable:
            break
        widest = max(shrinkable, key=lambda i: widths[i])
        widths[widest] -= 1
    return widths


def _cut(text: str, width: int) -> str:
    text = " ".join(text.split())          # one line: newlines and tabs in names or reasons become spaces
    return text if len(text) <= width else text[:max(0, width - 1)] + ELLIPSIS


def render(columns: Sequence[tuple[str, int]], rows: list[list[str]], width: int | None = None) -> str:
    """`columns` are (header, least width when narrowed; 0 = never narrowed). Numbers align right."""
    width = width or shutil.get_terminal_size((120, 24)).columns
    rows = [[" ".join(str(c).split()) for c in r] for r in rows]
    widths = fit_widths(columns, rows, width)
    numeric = [all(r[i].replace(".", "", 1).replace("/", "").isdigit() or r[i] == "-" for r in rows) and rows
               for i in range(len(columns))]
    lines = []
    for cells in [[h for h, _ in columns], *rows]:
        parts = [_cut(c, w).rjust(w) if numeric[i] else _cut(c, w).ljust(w)
                 for i, (c, w) in enumerate(zip(cells, widths, strict=True))]
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines) + "\n"


def clock(t: float | None) -> str:
    if t is None:
        return "-"
    same_day = time.strftime("%Y-%m-%d", time.localtime(t)) == time.strftime("%Y-%m-%d")
    return time.strftime("%H:%M:%S" if same_day else "%m-%dT%H:%M", time.localtime(t))


def duration(seconds: float | None) -> str:
    """Slurm's elapsed format: [D-]HH:MM:SS (MM:SS under an hour)."""
    if seconds is None:
        return "-"
    s = int(max(0.0, seconds))
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    if d:
        return f"{d}-{h:02d}:{m:02d}:{s:02d}"
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def gpus(job: dict) -> str:
    """Held GPUs (computed on) of a job that has them, else what it asks: '4', or '2-8' when elastic."""
    computed = sum(job.get("shape") or []) or sum(len(v) for v in job["gpus"].values())
    if computed:
        return str(computed)
    lo, hi = job.get("min_gpus", job["gpus_requested"]), job.get("max_gpus", job["gpus_requested"])
    return str(hi) if lo == hi else f"{lo}-{hi}"


def where_or_reason(job: dict) -> str:
    if job["state"] == "queued":
        return f"({job.get('pending') or 'None'})"
    if job["where"] and job["state"] not in ("done", "failed", "cancelled", "lost", "timeout"):
        return job["where"]
    if job["exit_code"] is not None and job["state"] in ("done", "failed"):
        return f"exit {job['exit_code']}"
    return job["reason"] or "-"


JOB_COLUMNS = [("ID", 0), ("USER", 6), ("NAME", 8), ("STATE", 0), ("GPUS", 0), ("TIME", 0), ("LIMIT", 0),
               ("WHERE (REASON)", 12)]


def jobs_table(jobs: list[dict], now: float | None = None) -> str:
    now = time.time() if now is None else now
    rows = []
    for j in jobs:
        running = j["started"] is not None and j["ended"] is None
        elapsed = (now - j["started"]) if running else (j["ended"] - j["started"]) if j["started"] and j["ended"] else None
        rows.append([str(j["id"]), j.get("user") or "-", j["name"], j["state"], gpus(j), duration(elapsed),
                     duration(j.get("time_limit_s")) if j.get("time_limit_s") else "-", where_or_reason(j)])
    return render(JOB_COLUMNS, rows)


HISTORY_COLUMNS = [("ID", 0), ("USER", 6), ("NAME", 8), ("STATE", 0), ("GPUS", 0), ("SUBMIT", 0), ("START", 0),
                   ("END", 0), ("WAIT", 0), ("RUN", 0), ("EXIT", 0), ("REASON", 8)]


def history_row(j: dict) -> dict:
    """sacct's view of a job: times, wait (submit to last start) and run (last start to end) in seconds."""
    wait = j["started"] - j["submitted"] if j["started"] is not None else None
    run = j["ended"] - j["started"] if j["started"] is not None and j["ended"] is not None else None
    return {**j, "wait_s": wait, "run_s": run}


def history_table(jobs: list[dict]) -> str:
    rows = [[str(j["id"]), j.get("user") or "-", j["name"], j["state"], gpus(j), clock(j["submitted"]),
             clock(j["started"]), clock(j["ended"]), duration(j["wait_s"]), duration(j["run_s"]),
             "-" if j["exit_code"] is None else str(j["exit_code"]), j["reason"] or "-"] for j in jobs]
    return render(HISTORY_COLUMNS, rows)


def write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()
