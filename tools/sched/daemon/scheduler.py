"""The daemon's scheduling loop, without the network: submit, cancel, recover after a crash, and
`step()` (follow the jobs that hold GPUs, then let the policy start queued ones).

Every decision reads the clock it is given (tests drive a VirtualClock and call `step()` directly).
Device ids are picked here, lowest free first per node, from what the job table says is held, and
checked disjoint before anything starts: a GPU is held from `launching` until the job's processes
are gone, so no two jobs ever share one. One lock serialises all of it (RPC threads and the loop).

The queued jobs and their policy views are kept in memory between steps (`_queued`, in submission
order; only this daemon changes the table, under its lock file), so a step reads only the jobs
that hold GPUs from SQLite. Preemption (an executor that can restart jobs, `restartable`): the
policy's Preempt or Resize moves a running job to `preempting` and SIGTERMs its process group
(SIGKILL after the cancel grace); once it is gone the job is queued again with the GPU-seconds it
attained, a restart counted and logged, and its next run gets a fresh run directory.

Slurm's everyday rules (admission.py): jobs that can never fit are refused at submit; queued jobs
held by a dependency, the daemon's --max-time or a cluster they no longer fit never reach the
policy; the rest reach it in fair-share order; every queued job carries a pending reason. A running
job past its wall-time limit is stopped as a cancel is (SIGTERM, SIGKILL after the grace) and ends
`timeout`.
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from mlsyskit.core.clock import Clock
from mlsyskit.core.errors import UsageError
from mlsyskit.tools.sched.daemon import adapter, admission
from mlsyskit.tools.sched.daemon.jobstore import (
    ACTIVE,
    CANCELLED,
    CANCELLING,
    DONE,
    FAILED,
    FINAL,
    LAUNCHING,
    LOST,
    PREEMPTING,
    QUEUED,
    RUNNING,
    TIME_LIMIT,
    TIMEOUT,
    Job,
    JobStore,
)
from mlsyskit.tools.sched.daemon.progress import Progress, read_progress
from mlsyskit.tools.sched.daemon.specs import ClusterConfig, JobRequest
from mlsyskit.tools.sched.executors.base import EXITED, Executor, ExecutorError, Launch, NodeSlice
from mlsyskit.tools.sched.executors.base import RUNNING as EXEC_RUNNING
from mlsyskit.tools.sched.policies.base import Policy
from mlsyskit.tools.sched.state import JobView, WorkHistory
from mlsyskit.tools.sched.throughput import ThroughputModel

FAIR_PERIOD_S = 30.0


class Scheduler:
    def __init__(self, cluster: ClusterConfig, store: JobStore, executor: Executor, policy: Policy,
                 model: ThroughputModel, clock: Clock, state_dir: Path, *, cancel_grace_s: float = 10.0,
                 max_time_s: float = 0.0, log: Callable[[str], None] = lambda msg: None) -> None:
        if len(cluster.nodes) > 1 and executor.one_machine and any(n.devices for n in cluster.nodes):
            ids = [d for n in cluster.nodes for d in n.devices]
            if len(set(ids)) != len(ids):
                raise UsageError("nodes: on one machine (local executor) nodes must not list the same device ids")
        self.cluster, self.store, self.executor, self.policy, self.model = cluster, store, executor, policy, model
        self.clock, self.state_dir, self.cancel_grace_s, self.log = clock, Path(state_dir), cancel_grace_s, log
        self.max_time_s, self.lock = max_time_s, threading.RLock()
        self.measured = adapter.Measurements.of(policy)   # measured rates -> the policy's online model
        self._cancel_deadline: dict[int, float] = {}
        self._said: set[str] = set()
        self.history = WorkHistory()   # finished jobs' sizes, read once here and kept up to date
        self.fair = admission.FairShare()
        self._ended_count = 0                      # jobs accounted: a fair order computed before is stale
        self._fair_cache: tuple | None = None      # (eligible ids and _ended_count, when, order)
        for job in store.jobs(FINAL):
            adapter.learn(self.history, job, model)
            self._account(job)
        self._pending: dict[int, str] = {}          # queued job -> pending reason, as of the last step
        self._never: dict[int, bool] = {}           # queued job -> it no longer fits this cluster
        self._deps_done: set[int] = set()           # afterok targets known done (done is final)
        self._queued: dict[int, tuple[Job, JobView]] = {}
        self._inbox: list[Job] = []                 # submitted, not yet taken into `_queued` (see _drain)
        self._inbox_lock = threading.Lock()
        self.reload_queue()

    def reload_queue(self) -> None:
        """Read the queue from the table (at start; the benchmark's full-rescan peer calls it every step)."""
        with self._inbox_lock:
            self._inbox = []
        self._queued = {j.id: (j, adapter.queued_view(j, self.model)) for j in self.store.jobs((QUEUED,))}

    def _enqueue(self, job_id: int) -> None:
        """Put a job that is queued again back in submission order (rare: restarts, preemptions)."""
        job = self.store.get(job_id)
        self._queued[job_id] = (job, adapter.queued_view(job, self.model))
        self._queued = dict(sorted(self._queued.items()))

    # ---- requests ----------------------------------------------------------------------------------
    def submit(self, request: JobRequest, user: str = "") -> Job:
        return self.submit_all(request, user)[0]

    def submit_all(self, request: JobRequest, user: str = "", tasks: tuple[int, ...] = (),
                   key: str | None = None) -> list[Job]:
        """Queue a job (or one per array task); refuse one that can never run here or waits on no job.
        It never waits for a scheduling step: new jobs go to an inbox the next step takes in. A `key`
        seen before returns that submit's jobs (a retried submit never queues twice)."""
        self.model.check_app(request.model_app)
        why = admission.unavailable(self.cluster, request)
        if why:
            raise UsageError(why)
        missing = [d for d, states in self.store.states_of(request.after_ok).items() if not states]
        if missing:
            raise UsageError(f"dependency: no job {missing[0]}")
        ids, new = self.store.add(request, self.clock.now(), user, tasks, key)
        jobs = [self.store.get(i) for i in ids]
        if new:
            with self._inbox_lock:
                self._inbox.extend(jobs)
            what = str(ids[0]) if len(ids) == 1 else f"{ids[0]}-{ids[-1]} (array of {len(ids)})"
            self.log(f"job {what} ({request.display_name}) queued: {request.gpus} GPU(s), app {request.app or '- (exact GPUs)'}"
                     + (f", user {user}" if user else ""))
        return jobs

    def _drain(self) -> None:
        """Take submitted jobs into the queue (under `lock`: every change of a queued job drains first)."""
        with self._inbox_lock:
            jobs, self._inbox = self._inbox, []
        for job in jobs:
            self._queued[job.id] = (job, adapter.queued_view(job, self.model))

    def cancel(self, job_id: int) -> Job:
        with self.lock:
            self._drain()
            job = self.store.get(job_id)
            if job.state == QUEUED:
                self.store.cancel_queued(job_id, self.clock.now())
                self._queued.pop(job_id, None)
                self._never.pop(job_id, None)
            elif job.state in (RUNNING, PREEMPTING) and self.store.mark_cancelling(job_id, "cancel requested"):
                self._cancel_deadline[job_id] = self.clock.now() + self.cancel_grace_s
                self._signal(job, force=False)
            elif job.state in FINAL:
                raise UsageError(f"job {job_id} has already ended ({job.state})")
            self.log(f"job {job_id} cancel requested")
            return self.store.get(job_id)

    # ---- the loop ------------------------------------------------------------------------------------
    def recover(self) -> None:
        """After a restart: jobs whose launch was cut short are found (running) or queued again."""
        with self.lock:
            for job in self.store.jobs((LAUNCHING,)):
                launch = self.launch_of(job)
                try:
                    handle = self.executor.recover(launch)
                except ExecutorError as e:
                    self.store.finish(job.id, LOST, self.clock.now(), None, f"after a daemon restart: {e}")
                    continue
                if handle is None:
                    self.store.requeue(job.id, "its launch was cut short by a daemon restart before it started; "
                                               "queued again")
                    self._enqueue(job.id)
                    self.log(f"job {job.id}: launch never started; queued again")
                else:
                    self.store.mark_running(job.id, handle)
                    self.log(f"job {job.id}: re-attached after a daemon restart")
            for job in self.store.jobs((RUNNING, CANCELLING, PREEMPTING)):
                self.log(f"job {job.id} ({job.state}) re-attached: {self.executor.name} handle {job.handle}")

    def step(self) -> None:
        with self.lock:
            self._drain()
            for job in self.store.jobs(ACTIVE):
                self._follow(job)
            self._schedule()

    def _follow(self, job: Job) -> None:
        now = self.clock.now()
        if job.handle is None:  # launching: only seen after a crash, handled by recover()
            return
        try:
            status = self.executor.poll(self.launch_of(job), job.handle)
        except ExecutorError as e:
            self._say(f"job {job.id}: cannot poll ({e}); will retry")
            return
        if job.state in (CANCELLING, PREEMPTING):
            if status.kind != EXEC_RUNNING:
                self._cancel_deadline.pop(job.id, None)
                if job.state == CANCELLING and job.reason.startswith(TIME_LIMIT):
                    self._finish(job, TIMEOUT, now, status.exit_code, job.reason)
                elif job.state == CANCELLING:
                    self._finish(job, CANCELLED, now, status.exit_code, "cancelled by request")
                elif status.kind == EXITED and status.exit_code == 0:
                    # it finished before the preemption took effect: done, never run again (a job
                    # that checkpoints on SIGTERM exits non-zero to be requeued)
                    self._finish_exited(job, status, now)
                else:
                    self._requeue_preempted(job, now)
            elif now >= self._cancel_deadline.setdefault(job.id, now + self.cancel_grace_s):
                self._signal(job, force=True)
            return
        if status.kind == EXEC_RUNNING:
            limit = admission.wall_limit(job.request, self.max_time_s)
            if (job.state == RUNNING and limit and job.started is not None and now - job.started >= limit
                    and self.store.mark_cancelling(job.id, f"{TIME_LIMIT}: ran past its wall-time limit ({limit:g} s)")):
                self._cancel_deadline[job.id] = now + self.cancel_grace_s
                self._signal(job, force=False)
                self.log(f"job {job.id} reached its wall-time limit ({limit:g} s): stopping it")
            return
        if status.kind == EXITED:
            self._finish_exited(job, status, now)
        else:
            self._finish(job, LOST, now, None, status.reason)

    def _finish(self, job: Job, state: str, now: float, exit_code: int | None, reason: str,
                samples: float | None = None) -> None:
        if self.store.finish(job.id, state, now, exit_code, reason, samples):
            ended = self.store.get(job.id)
            adapter.learn(self.history, ended, self.model)
            self._account(ended)
            self.log(f"job {job.id} {state}" + (f" (exit {exit_code})" if exit_code is not None else "")
                     + (f": {reason}" if reason and state != FAILED else ""))

    def _account(self, job: Job) -> None:
        """Count an ended job's GPU-seconds to its user's fair share."""
        self._ended_count += 1
        ran = job.held * (job.ended - job.started) if job.started is not None and job.ended is not None else 0.0
        if job.attained + ran > 0 and job.ended is not None:
            self.fair.add(job.user, job.attained + max(0.0, ran), job.ended)

    def _finish_exited(self, job: Job, status, now: float) -> None:
        state = DONE if status.exit_code == 0 else FAILED
        report = read_progress(self.launch_of(job).run_dir / "progress")
        self._finish(job, state, now, status.exit_code, "" if state == DONE else f"exit status {status.exit_code}",
                     report.s_last if report else None)

    def _preempt(self, job_id: int, now: float) -> None:
        if self.store.mark_preempting(job_id):
            self._cancel_deadline[job_id] = now + self.cancel_grace_s
            self._signal(self.store.get(job_id), force=False)
            self.log(f"job {job_id} preempted by the policy: stopping its processes")

    def _requeue_preempted(self, job: Job, now: float) -> None:
        attained = job.attained + job.held * (now - (job.started if job.started is not None else now))
        restarts = job.restarts + 1
        if self.store.requeue_preempted(job.id, attained, restarts, f"preempted by the policy (restart {restarts}); "
                                        "queued again, attained service kept"):
            self._enqueue(job.id)
            self.log(f"job {job.id} queued again after preemption: restart {restarts}, "
                     f"{attained:.0f} GPU-s attained")

    def _signal(self, job: Job, force: bool) -> None:
        try:
            self.executor.cancel(self.launch_of(job), job.handle, force)
        except ExecutorError as e:
            self._say(f"job {job.id}: cancel failed ({e}); will retry")

    def _schedule(self) -> None:
        if not self._queued:
            self._pending = {}
            return
        jobs = self.store.jobs(ACTIVE)
        now = self.clock.now()
        eligible, reasons = self._eligible(now)
        ordered = self._fair_order(eligible, jobs, now)
        result = adapter.plan(self.policy, self.cluster, jobs, self.model, now, self._reports(jobs), self.history,
                              ordered, preemptible=self.executor.restartable, measured=self.measured)
        for why in result.ignored:
            self._say(why)
        for job_id in result.preempts:
            self._preempt(job_id, now)
        held = {node: set() for node in range(len(self.cluster.nodes))}
        for job in jobs:
            for node, ids in job.gpus.items():
                if job.state in ACTIVE:
                    held[node].update(ids)
        for start in result.starts:
            self._start(start, held, now)
        self._pending = {**reasons, **admission.waiting_reasons(
            ((i, job.request) for i, (job, _) in ordered.items() if i in self._queued), self.cluster, held)}

    def _fair_order(self, eligible: dict[int, tuple[Job, JobView]], jobs: list[Job], now: float):
        """admission.fair_queue, recomputed when the eligible jobs change, a job ends, or every
        FAIR_PERIOD_S (Slurm's PriorityCalcPeriod): sorting thousands of jobs every step is waste."""
        key = (frozenset(eligible), self._ended_count)
        cached = self._fair_cache
        if cached is None or cached[0] != key or now - cached[1] >= FAIR_PERIOD_S:
            ordered = admission.fair_queue(eligible, jobs, now, self.fair)
            self._fair_cache = (key, now, list(ordered))
            return ordered
        return {i: eligible[i] for i in cached[2]}

    def _eligible(self, now: float) -> tuple[dict[int, tuple[Job, JobView]], dict[int, str]]:
        """Queued jobs the policy may start, and the hold reason of each other one. A job whose
        afterok dependency ended other than done is cancelled (Slurm: DependencyNeverSatisfied)."""
        deps = {d for job, _ in self._queued.values() if job.request.dependency for d in job.request.after_ok}
        states = self.store.states_of(sorted(deps - self._deps_done))
        self._deps_done.update(d for d, s in states.items() if s and all(x == DONE for x in s))
        states.update((d, [DONE]) for d in self._deps_done)
        eligible: dict[int, tuple[Job, JobView]] = {}
        reasons: dict[int, str] = {}
        for job_id, (job, view) in list(self._queued.items()):
            request = job.request
            broken = admission.broken_dependency(request, states, FINAL) if request.after_ok else None
            if broken is not None:
                why = f"DependencyNeverSatisfied: job {broken} ended {'/'.join(sorted(set(states.get(broken) or ['gone'])))}"
                if self.store.cancel_queued(job_id, now, why):
                    self._queued.pop(job_id)
                    self.log(f"job {job_id} cancelled: {why}")
                continue
            never = self._never.get(job_id)
            if never is None:
                never = self._never[job_id] = admission.unavailable(self.cluster, request) is not None
            hold = admission.hold_reason(request, self.max_time_s, states, never) \
                if never or request.dependency or self.max_time_s else None
            if hold is None:
                eligible[job_id] = (job, view)
            else:
                reasons[job_id] = hold
        return eligible, reasons

    def _start(self, start: adapter.PlannedStart, held: dict[int, set[int]], now: float) -> None:
        gpus: dict[int, tuple[int, ...]] = {}
        for node, count in start.placement:
            free = [d for d in self.cluster.devices(node, self.executor.one_machine) if d not in held[node]]
            if len(free) < count:  # the policy planned on the same table, so this is a bug: refuse, loudly
                raise RuntimeError(f"node {node} has {len(free)} free device ids, the plan needs {count}")
            gpus[node] = tuple(free[:count])
        queued_job, _ = self._queued.pop(start.job_id)
        self._never.pop(start.job_id, None)
        # a restarted job runs in a fresh directory: the stopped run's pid and exit files stay apart
        attempt = str(start.job_id) + (f"-r{queued_job.restarts}" if queued_job.restarts else "")
        run_dir = self.state_dir / "jobs" / attempt
        if not self.store.mark_launching(start.job_id, start.placement, start.shape, gpus, str(run_dir), now):
            return
        for node, ids in gpus.items():
            held[node].update(ids)
        job = self.store.get(start.job_id)
        launch = self.launch_of(job)
        try:
            handle = self.executor.launch(launch)
        except ExecutorError as e:
            self.store.finish(job.id, FAILED, self.clock.now(), None, f"could not start: {e}")
            self.log(f"job {job.id} could not start: {e}")
            return
        self.store.mark_running(job.id, handle)
        where = " ".join(f"{s.node}:{','.join(map(str, s.visible))}" for s in launch.nodes)
        self.log(f"job {job.id} started on {where} ({self.executor.name} handle {handle})")

    def _reports(self, jobs: list[Job]) -> dict[int, Progress]:
        """Progress the running jobs reported (I/O here, so the adapter stays pure)."""
        reports = {}
        for job in jobs:
            if job.state in ACTIVE and job.run_dir:
                report = read_progress(self.launch_of(job).run_dir / "progress")
                if report is not None:
                    reports[job.id] = report
        return reports

    # ---- views ---------------------------------------------------------------------------------------
    def launch_of(self, job: Job) -> Launch:
        slices = []
        for (node, _), computed in zip(job.placement, job.shape, strict=False):
            spec = self.cluster.nodes[node]
            ids = job.gpus.get(node, ())
            slices.append(NodeSlice(spec.name, spec.slurm_host, ids, ids[:computed]))
        run_dir = Path(job.run_dir) if job.run_dir else self.state_dir / "jobs" / str(job.id)
        env = dict(job.request.env)
        if job.array_job is not None:
            env.update(MARBLE_ARRAY_JOB_ID=str(job.array_job), MARBLE_ARRAY_TASK_ID=str(job.array_task))
        if any(self.cluster.nodes[node].logical for node, _ in job.placement):
            env["MARBLE_LOGICAL_GPUS"] = "1"
        return Launch(job.id, job.name, job.request.cmd, run_dir, job.request.workdir, env, tuple(slices),
                      f"marble-{self.store.instance}-{job.id}")

    def describe(self, job: Job) -> dict:
        """The job as clients see it, with `where` naming nodes and device ids."""
        where = " ".join(f"{s.node}:{','.join(map(str, s.held))}" for s in self.launch_of(job).nodes) if job.gpus else ""
        pending = self._pending.get(job.id, admission.NONE) if job.state == QUEUED else ""
        run = job.held * ((job.ended or self.clock.now()) - job.started) if job.started is not None else 0.0
        return {**job.as_dict(), "where": where, "pending": pending, "attained": job.attained + max(0.0, run)}

    def nodes(self) -> list[dict]:
        with self.lock:
            jobs = self.store.jobs(ACTIVE)
        rows = []
        for i, spec in enumerate(self.cluster.nodes):
            used = {d: j.id for j in jobs for d in j.gpus.get(i, ())}
            devices = self.cluster.devices(i, self.executor.one_machine)
            rows.append({"node": spec.name, "host": spec.slurm_host, "gpus": spec.gpus, "logical": spec.logical,
                         "used": len(used), "free": spec.gpus - len(used),
                         "devices": {str(d): used.get(d) for d in devices}})
        return rows

    def _say(self, message: str) -> None:
        """Log a repeating message once."""
        if message not in self._said:
            self._said.add(message)
            self.log(message)
