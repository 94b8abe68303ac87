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
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from mlsyskit.core.clock import Clock
from mlsyskit.core.errors import UsageError
from mlsyskit.tools.sched.daemon import adapter
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


class Scheduler:
    def __init__(self, cluster: ClusterConfig, store: JobStore, executor: Executor, policy: Policy,
                 model: ThroughputModel, clock: Clock, state_dir: Path, *, cancel_grace_s: float = 10.0,
                 log: Callable[[str], None] = lambda msg: None) -> None:
        if len(cluster.nodes) > 1 and executor.one_machine and any(n.devices for n in cluster.nodes):
            ids = [d for n in cluster.nodes for d in n.devices]
            if len(set(ids)) != len(ids):
                raise UsageError("nodes: on one machine (local executor) nodes must not list the same device ids")
        self.cluster, self.store, self.executor, self.policy, self.model = cluster, store, executor, policy, model
        self.clock, self.state_dir, self.cancel_grace_s, self.log = clock, Path(state_dir), cancel_grace_s, log
        self.lock = threading.RLock()
        self._cancel_deadline: dict[int, float] = {}
        self._said: set[str] = set()
        self.history = WorkHistory()   # finished jobs' sizes, read once here and kept up to date
        for job in store.jobs((DONE,)):
            adapter.learn(self.history, job, model)
        self._queued: dict[int, tuple[Job, JobView]] = {}
        self.reload_queue()

    def reload_queue(self) -> None:
        """Read the queue from the table (at start; the benchmark's full-rescan peer calls it every step)."""
        self._queued = {j.id: (j, adapter.queued_view(j, self.model)) for j in self.store.jobs((QUEUED,))}

    def _enqueue(self, job_id: int) -> None:
        """Put a job that is queued again back in submission order (rare: restarts, preemptions)."""
        job = self.store.get(job_id)
        self._queued[job_id] = (job, adapter.queued_view(job, self.model))
        self._queued = dict(sorted(self._queued.items()))

    # ---- requests ----------------------------------------------------------------------------------
    def submit(self, request: JobRequest) -> Job:
        self.model.check_app(request.app)
        total = self.cluster.total_gpus
        for name, value in (("gpus", request.gpus), ("max_gpus", request.upper_gpus)):
            if value > total:  # as the simulator refuses: no policy could ever start it as asked
                raise UsageError(f"{name}: {value} is more GPUs than the cluster has ({total})")
        with self.lock:
            job_id = self.store.add(request, self.clock.now())
            job = self.store.get(job_id)
            self._queued[job_id] = (job, adapter.queued_view(job, self.model))
            self.log(f"job {job_id} ({request.display_name}) queued: {request.gpus} GPU(s), app {request.app}")
            return self.store.get(job_id)

    def cancel(self, job_id: int) -> Job:
        with self.lock:
            job = self.store.get(job_id)
            if job.state == QUEUED:
                self.store.cancel_queued(job_id, self.clock.now())
                self._queued.pop(job_id, None)
            elif job.state in (RUNNING, PREEMPTING) and self.store.mark_cancelling(job_id):
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
                if job.state == CANCELLING:
                    self.store.finish(job.id, CANCELLED, now, status.exit_code, "cancelled by request")
                    self.log(f"job {job.id} cancelled")
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
            return
        if status.kind == EXITED:
            self._finish_exited(job, status, now)
        else:
            self.store.finish(job.id, LOST, now, None, status.reason)
            self.log(f"job {job.id} lost: {status.reason}")

    def _finish_exited(self, job: Job, status, now: float) -> None:
        state = DONE if status.exit_code == 0 else FAILED
        report = read_progress(self.launch_of(job).run_dir / "progress")
        self.store.finish(job.id, state, now, status.exit_code, "" if state == DONE else
                          f"exit status {status.exit_code}", report.s_last if report else None)
        adapter.learn(self.history, self.store.get(job.id), self.model)
        self.log(f"job {job.id} {state} (exit {status.exit_code})")

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
            return
        jobs = self.store.jobs(ACTIVE)
        now = self.clock.now()
        result = adapter.plan(self.policy, self.cluster, jobs, self.model, now, self._reports(jobs), self.history,
                              self._queued, preemptible=self.executor.restartable)
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

    def _start(self, start: adapter.PlannedStart, held: dict[int, set[int]], now: float) -> None:
        gpus: dict[int, tuple[int, ...]] = {}
        for node, count in start.placement:
            free = [d for d in self.cluster.devices(node, self.executor.one_machine) if d not in held[node]]
            if len(free) < count:  # the policy planned on the same table, so this is a bug: refuse, loudly
                raise RuntimeError(f"node {node} has {len(free)} free device ids, the plan needs {count}")
            gpus[node] = tuple(free[:count])
        queued_job, _ = self._queued.pop(start.job_id)
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
        if any(self.cluster.nodes[node].logical for node, _ in job.placement):
            env["MARBLE_LOGICAL_GPUS"] = "1"
        return Launch(job.id, job.name, job.request.cmd, run_dir, job.request.workdir, env, tuple(slices),
                      f"marble-{self.store.instance}-{job.id}")

    def describe(self, job: Job) -> dict:
        """The job as clients see it, with `where` naming nodes and device ids."""
        where = " ".join(f"{s.node}:{','.join(map(str, s.held))}" for s in self.launch_of(job).nodes) if job.gpus else ""
        return {**job.as_dict(), "where": where}

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
