"""marble-elastic: marble, plus growing running jobs by checkpoint-restart.

After marble has placed what it can from the queue, GPUs that are still free (and not promised to a
waiting head job) go to running jobs that were started below their efficient size p*: a job is
restarted on its full shape if the time it saves exceeds `grow_min_gain` restart costs. The restart
cost (`--restart-cost`) is paid as time holding the new GPUs without progress.
"""
from __future__ import annotations

from mlsyskit.tools.sched.policies.base import register
from mlsyskit.tools.sched.policies.marble import Marble
from mlsyskit.tools.sched.state import Action, ClusterState, Decision, Resize


@register
class MarbleElastic(Marble):
    name = "marble-elastic"
    description = "marble + grow shrunken jobs to their efficient size by checkpoint-restart"

    def decide(self, state: ClusterState) -> Decision:
        if state.free.total == 0:
            return Decision()
        free = state.free.copy()
        actions: list[Action] = self.place_queue(state, free) if state.queue else []
        started = {a.job_id for a in actions}
        if free.total == 0 or any(j not in started for j in state.queue):
            return Decision(tuple(actions))  # waiting jobs come first
        gpn, now, cost = state.spec.gpus_per_node, state.now, state.restart_cost
        for job in state.running.values():
            if free.total == 0:
                break
            target = self.shapes_for(job, gpn)[-1]
            if sum(job.shape) >= sum(target) or now < job.busy_until:
                continue
            free.give(job.placement)
            placement = free.fit(target)
            if placement is None:
                free.take(job.placement)
                continue
            remaining = job.remaining(now)
            current = remaining / job.rate
            grown = cost + remaining / self.model.rate(job.spec.app, target, job.spec.batch_size)
            if current - grown <= self.options.grow_min_gain * cost:
                free.take(job.placement)
                continue
            free.take(placement)
            actions.append(Resize(job.spec.job_id, placement, target))
        return Decision(tuple(actions))
