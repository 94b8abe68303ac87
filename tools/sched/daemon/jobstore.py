"""The daemon's job table in SQLite (core MetaStore, WAL, synchronous=FULL): every transition is one
guarded UPDATE (`WHERE state IN (...)`), so a job leaves `queued` at most once and is never launched twice,
and an acknowledged submit survives a crash.

States: queued -> launching -> running -> done | failed | cancelled | lost
        queued -> cancelled;  launching -> queued (a launch that provably never started, after a crash)
        running -> cancelling -> cancelled | timeout (past its wall-time limit: reason "TimeLimit ...")
        running -> preempting -> queued (the policy preempted or resized it: the process group is
        stopped and the job queued again, its attained service kept and the restart counted)
`launching` is written before the executor starts anything, so a crash in between is visible on restart.
"""
from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlsyskit.core.errors import RuntimeFailure, UsageError
from mlsyskit.core.storage import MetaStore, StorageError
from mlsyskit.tools.sched.daemon.specs import JobRequest

QUEUED, LAUNCHING, RUNNING, CANCELLING = "queued", "launching", "running", "cancelling"
PREEMPTING = "preempting"
DONE, FAILED, CANCELLED, LOST, TIMEOUT = "done", "failed", "cancelled", "lost", "timeout"
ACTIVE = (LAUNCHING, RUNNING, CANCELLING, PREEMPTING)        # states that hold GPUs
FINAL = (DONE, FAILED, CANCELLED, LOST, TIMEOUT)
TIME_LIMIT = "TimeLimit"                                      # reason prefix of a job stopped at its wall time

_DDL = """CREATE TABLE IF NOT EXISTS marble_jobs (
    id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL, request TEXT NOT NULL, state TEXT NOT NULL,
    submitted REAL NOT NULL, started REAL, ended REAL, placement TEXT, shape TEXT, gpus TEXT, handle TEXT,
    exit_code INTEGER, reason TEXT NOT NULL DEFAULT '', run_dir TEXT, samples REAL,
    attained REAL NOT NULL DEFAULT 0, restarts INTEGER NOT NULL DEFAULT 0, user TEXT NOT NULL DEFAULT '',
    array_job INTEGER, array_task INTEGER, submit_key TEXT)"""
# Columns added after the first release, with their definitions (older tables get them by ALTER TABLE).
_ADDED = {"attained": "REAL NOT NULL DEFAULT 0", "restarts": "INTEGER NOT NULL DEFAULT 0",
          "user": "TEXT NOT NULL DEFAULT ''", "array_job": "INTEGER", "array_task": "INTEGER", "submit_key": "TEXT"}
_COLUMNS = ("id, name, request, state, submitted, started, ended, placement, shape, gpus, handle, exit_code, reason, "
            "run_dir, samples, attained, restarts, user, array_job, array_task")


class UnknownJobError(UsageError):
    pass


@dataclass(frozen=True)
class Job:
    id: int
    name: str
    request: JobRequest
    state: str
    submitted: float
    started: float | None
    ended: float | None
    placement: tuple[tuple[int, int], ...]   # ((node index, GPUs held), ...) as the policy decided
    shape: tuple[int, ...]                   # GPUs computed on per node (may be fewer than held: fifo)
    gpus: dict[int, tuple[int, ...]]         # node index -> device ids held
    handle: str | None
    exit_code: int | None
    reason: str
    run_dir: str | None
    samples: float | None = None             # last samples count the job reported (progress.py), once ended
    attained: float = 0.0                    # GPU-seconds held in runs that were preempted (Tiresias' service)
    restarts: int = 0                        # times the job was preempted or resized and queued again
    user: str = ""                           # who submitted it (proven by a user token or certificate, if any)
    array_job: int | None = None             # the first job id of its array (--array), else None
    array_task: int | None = None            # its task id in that array

    @property
    def held(self) -> int:
        return sum(len(ids) for ids in self.gpus.values())

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "state": self.state, "app": self.request.app,
                "cmd": self.request.cmd, "gpus_requested": self.request.gpus, "submitted": self.submitted,
                "started": self.started, "ended": self.ended, "placement": [list(p) for p in self.placement],
                "shape": list(self.shape), "gpus": {str(k): list(v) for k, v in self.gpus.items()},
                "handle": self.handle, "exit_code": self.exit_code, "reason": self.reason, "run_dir": self.run_dir,
                "samples": self.samples, "attained": self.attained, "restarts": self.restarts, "user": self.user,
                "array_job": self.array_job, "array_task": self.array_task, "time_limit_s": self.request.time_limit_s,
                "dependency": self.request.dependency, "min_gpus": self.request.lower_gpus,
                "max_gpus": self.request.upper_gpus}


def _row(r: tuple, requests: dict[int, JobRequest]) -> Job:
    req = requests.get(r[0])
    if req is None:  # a request never changes: decode it once per process
        req = requests[r[0]] = JobRequest(**json.loads(r[2]))
    gpus = {int(k): tuple(v) for k, v in json.loads(r[9]).items()} if r[9] else {}
    placement = tuple(tuple(p) for p in json.loads(r[7])) if r[7] else ()
    return Job(r[0], r[1], req, r[3], r[4], r[5], r[6], placement, tuple(json.loads(r[8])) if r[8] else (), gpus,
               r[10], r[11], r[12], r[13], r[14], r[15], r[16], r[17], r[18], r[19])


class JobStore:
    def __init__(self, path: str | Path) -> None:
        try:
            self.db = MetaStore(path, synchronous="FULL")
            self.db.ensure_table(_DDL)
            have = {row[1] for row in self.db.query("PRAGMA table_info(marble_jobs)")}
            for column, definition in _ADDED.items():
                if column not in have:
                    self.db.execute(f"ALTER TABLE marble_jobs ADD COLUMN {column} {definition}")
            self.db.execute("CREATE UNIQUE INDEX IF NOT EXISTS marble_jobs_submit_key ON marble_jobs (submit_key)")
            with self.db.transaction():
                if self.db.get("marble", "instance", None) is None:
                    self.db.put("marble", "instance", secrets.token_hex(4))
        except StorageError as e:  # corrupt, unreadable or full: say so, do not guess
            raise RuntimeFailure(f"the job table cannot be used: {e}") from None
        self._requests: dict[int, JobRequest] = {}

    @property
    def instance(self) -> str:
        """A random id of this store (names Slurm jobs, so a restarted daemon finds its own)."""
        return self.db.get("marble", "instance")

    def add(self, request: JobRequest, now: float, user: str = "", tasks: tuple[int, ...] = (),
            key: str | None = None) -> tuple[list[int], bool]:
        """Queue a job, or one job per array task (all in one transaction: all or none): (their ids, True).
        A `key` seen before (a client retrying a submit whose answer it lost) adds nothing: (the ids
        that submit made, False)."""
        body = json.dumps(request.as_dict())
        with self.db.transaction():
            if key is not None:
                seen = self.db.query("SELECT id, array_job FROM marble_jobs WHERE submit_key=?", (key,))
                if seen:
                    first, array = seen[0]
                    if array is None:
                        return [first], False
                    return [r[0] for r in self.db.query("SELECT id FROM marble_jobs WHERE array_job=? ORDER BY id",
                                                        (array,))], False
            if not tasks:
                self.db.execute("INSERT INTO marble_jobs (name, request, state, submitted, user, submit_key) "
                                "VALUES (?, ?, ?, ?, ?, ?)", (request.display_name, body, QUEUED, now, user, key))
                return [self.db.query("SELECT last_insert_rowid()")[0][0]], True
            ids: list[int] = []
            for task in tasks:
                self.db.execute("INSERT INTO marble_jobs (name, request, state, submitted, user, array_job, array_task, "
                                "submit_key) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                                (f"{request.display_name}[{task}]", body, QUEUED, now, user, ids[0] if ids else None,
                                 task, None if ids else key))
                ids.append(self.db.query("SELECT last_insert_rowid()")[0][0])
            self.db.execute("UPDATE marble_jobs SET array_job=? WHERE id=?", (ids[0], ids[0]))
            return ids, True

    def states_of(self, ids: tuple[int, ...] | list[int]) -> dict[int, list[str]]:
        """For each id: the states of that job and, when it is an array's first job, of every task of the array."""
        if not ids:
            return {}
        marks = ",".join("?" * len(ids))
        rows = self.db.query(f"SELECT id, state, array_job FROM marble_jobs WHERE id IN ({marks}) OR array_job IN "
                             f"({marks})", (*ids, *ids))
        out: dict[int, list[str]] = {i: [] for i in ids}
        for job_id, state, array_job in rows:
            for key in {job_id, array_job} & out.keys():
                out[key].append(state)
        return out

    def get(self, job_id: int) -> Job:
        rows = self.db.query(f"SELECT {_COLUMNS} FROM marble_jobs WHERE id=?", (job_id,))
        if not rows:
            raise UnknownJobError(f"no job {job_id}")
        return _row(rows[0], self._requests)

    def jobs(self, states: tuple[str, ...] | None = None) -> list[Job]:
        if states is None:
            rows = self.db.query(f"SELECT {_COLUMNS} FROM marble_jobs ORDER BY id")
        else:
            marks = ",".join("?" * len(states))
            rows = self.db.query(f"SELECT {_COLUMNS} FROM marble_jobs WHERE state IN ({marks}) ORDER BY id", states)
        return [_row(r, self._requests) for r in rows]

    def _move(self, job_id: int, from_states: tuple[str, ...], sets: dict[str, Any]) -> bool:
        """One guarded transition; False when the job was not in `from_states` (nothing changes)."""
        assign = ", ".join(f"{k}=?" for k in sets)
        marks = ",".join("?" * len(from_states))
        n = self.db.execute(f"UPDATE marble_jobs SET {assign} WHERE id=? AND state IN ({marks})",
                            (*sets.values(), job_id, *from_states))
        return n == 1

    def mark_launching(self, job_id: int, placement, shape, gpus: dict[int, tuple[int, ...]], run_dir: str,
                       now: float) -> bool:
        return self._move(job_id, (QUEUED,), {"state": LAUNCHING, "started": now,
                                               "placement": json.dumps([list(p) for p in placement]),
                                               "shape": json.dumps(list(shape)),
                                               "gpus": json.dumps({str(k): list(v) for k, v in gpus.items()}),
                                               "run_dir": run_dir})

    def mark_running(self, job_id: int, handle: str) -> bool:
        return self._move(job_id, (LAUNCHING,), {"state": RUNNING, "handle": handle})

    def requeue(self, job_id: int, reason: str) -> bool:
        """A launch that never started (checked by the executor) goes back to the queue, GPUs released."""
        return self._move(job_id, (LAUNCHING,), {"state": QUEUED, "started": None, "placement": None, "shape": None,
                                                  "gpus": None, "run_dir": None, "reason": reason})

    def mark_cancelling(self, job_id: int, reason: str = "") -> bool:
        return self._move(job_id, (LAUNCHING, RUNNING, PREEMPTING), {"state": CANCELLING, "reason": reason})

    def mark_preempting(self, job_id: int) -> bool:
        return self._move(job_id, (RUNNING,), {"state": PREEMPTING})

    def requeue_preempted(self, job_id: int, attained: float, restarts: int, reason: str) -> bool:
        """A preempted job whose processes are gone goes back to the queue, GPUs released, with the
        service it attained so far and its restart counted."""
        return self._move(job_id, (PREEMPTING,), {"state": QUEUED, "started": None, "placement": None, "shape": None,
                                                   "gpus": None, "handle": None, "run_dir": None, "reason": reason,
                                                   "attained": attained, "restarts": restarts})

    def cancel_queued(self, job_id: int, now: float, reason: str = "cancelled while queued") -> bool:
        return self._move(job_id, (QUEUED,), {"state": CANCELLED, "ended": now, "reason": reason})

    def finish(self, job_id: int, state: str, now: float, exit_code: int | None, reason: str,
               samples: float | None = None) -> bool:
        if state not in FINAL:
            raise ValueError(f"{state} is not a final state")
        return self._move(job_id, ACTIVE, {"state": state, "ended": now, "exit_code": exit_code, "reason": reason,
                                           "samples": samples})

    def close(self) -> None:
        self.db.close()
