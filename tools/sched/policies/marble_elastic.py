"""marble-elastic: marble-fifo, plus growing running jobs by checkpoint-restart.

After marble has placed what it can from the queue, GPUs that are still free go to running jobs
that were started below their efficient size p*: a job is restarted on its full shape if the time
it saves exceeds `grow_min_gain` restart costs. Growth respects the EASY reservation of a waiting
job: the grown job must end before the shadow time, or the GPUs it adds must come out of those the
reservation leaves spare. The restart cost (`--restart-cost`) is paid as time holding the new GPUs
without progress.
"""
from __future__ import annotations

from mlsyskit.tools.sched.policies.common import remaining_work
from mlsyskit.tools.sched.policies.marble_fifo import MarbleFifo
from mlsyskit.tools.sched.state import Action, ClusterState, Decision, Resize


class MarbleElastic(MarbleFifo):
    name = "marble-elastic"
    description = "marble + grow shrunken jobs to their efficient size by checkpoint-restart"

    def decide(self, state: ClusterState) -> Decision:
        if state.free.total == 0:
            return Decision()
        free = state.free.copy()
        actions: list[Action]
        actions, shadow, spare = self.place_queue(state, free) if state.queue else ([], None, 0)
        gpn, now, cost = state.spec.gpus_per_node, state.now, state.restart_cost
        for job in state.running.values():
            if free.total == 0:
                break
            target = self.shapes_for(job, gpn)[-1]
            added = sum(target) - sum(job.shape)
            if added <= 0 or now < job.busy_until:
                continue
            free.give(job.placement)
            placement = free.fit(target)
            if placement is None:
                free.take(job.placement)
                continue
            # The measured rate gives the level, the model the gain of the larger shape.
            remaining = remaining_work(self.model, state, job)
            current = remaining / job.measured_rate
            model_now = self.model.rate(job.app, job.shape, job.batch_size)
            grown = cost + remaining / (job.measured_rate * self.model.rate(job.app, target, job.batch_size) / model_now)
            harmless = shadow is None or now + grown <= shadow or added <= spare
            if current - grown <= self.options.grow_min_gain * cost or not harmless:
                free.take(job.placement)
                continue
            if shadow is not None and now + grown > shadow:
                spare -= added
            free.take(placement)
            actions.append(Resize(job.job_id, placement, target))
        return Decision(tuple(actions))
