"""How ./scripts/test spreads the suite over pytest-xdist workers (`--dist loadfile`, refined).

A worker gets whole files (a module-scoped cluster or daemon is started once per file), but:
- the costliest work goes first (longest processing time first): a 3-minute file started last is
  the run's tail while the other workers idle. COST_S holds measured seconds for the files that
  take long; any other test is estimated at PER_TEST_S.
- a file in SPREAD gives each of its tests to any worker (tests that share nothing and each run
  long: the demo's sections);
- the files of one SHARE_A_WORKER group run on one worker, one after the other (tests that must not
  overlap: each Ray test starts a Ray, and the local-Ray test skips when another Ray is running).
Outside xdist, or with another --dist, nothing here is used.
"""
from __future__ import annotations

from xdist.scheduler import LoadFileScheduling

# CPU seconds of a file's tests, everything they start included (a cpuacct cgroup per file, -n 0, on the
# 2-core machine; ~ marks an estimate from wall times). Only the order depends on these: a wrong figure
# makes the run slower, never wrong. Refresh: /usr/bin/time or a cgroup around `pytest -n 0 FILE`.
COST_S: dict[str, float] = {
    "tests/demo/test_demo.py": 280,              # ~ (--quick: 13 + ~50 + ~65 + 64 + 83 per section)
    "tests/kv/test_failover.py": 85,
    "tests/fl/test_ray_backend.py": 60,          # ~ (Ray's own daemons)
    "tests/fl/test_ray_local.py": 40,            # ~
    "tests/sched/test_daemon_slurmlike.py": 70,
    "tests/kv/test_cli.py": 60,                  # ~
    "tests/sched/test_daemon.py": 45,
    "tests/fl/test_real_federation.py": 46,
    "tests/sched/test_profile.py": 45,
    "tests/kv/test_check_repro.py": 40,
    "tests/kv/test_check.py": 37,
    "tests/sched/test_bench.py": 35,             # ~
    "tests/fl/test_real_scheduling.py": 33,
    "tests/sched/test_cli.py": 20,
    "tests/sched/test_daemon_preempt.py": 10,
    "tests/sched/test_daemon_scheduler.py": 9,
    "tests/fl/test_real_tls_door.py": 9,
    "tests/kv/test_check_client.py": 8,
    "tests/sched/test_executor_local.py": 8,
    "tests/kv/test_failover_node.py": 8,
    "tests/offload/test_tencache_ranks.py": 66,
    "tests/offload/test_tencache_safety.py": 23,
    "tests/offload/test_tencache_lazy.py": 21,
    "tests/offload/test_tencache_memory.py": 16,
    "tests/offload/test_tencache_errors.py": 13,
    "tests/kv/test_matrix.py": 10,
    "tests/core/test_help_pages.py": 62,
    "tests/fl/test_chaos.py": 50,
    "tests/kv/test_switch.py": 34,
    "tests/kv/test_supervisor.py": 29,
    "tests/core/test_packaging_cli.py": 28,
    "tests/kv/test_redis_lost.py": 22,
    "tests/kv/test_requirepass.py": 18,
    "tests/kv/test_multihost.py": 16,
    "tests/kv/test_redis_benchmark.py": 15,
    "tests/fl/test_identity.py": 12,
}
SPREAD = frozenset({"tests/demo/test_demo.py"})
SHARE_A_WORKER = {"tests/fl/test_ray_backend.py": "ray", "tests/fl/test_ray_local.py": "ray"}
PER_TEST_S = 0.5  # the estimate for a test of a file not in COST_S


def _file(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


class CostFirstScheduling(LoadFileScheduling):
    """loadfile, with the costliest work unit handed out first, SPREAD files split per test and
    SHARE_A_WORKER groups kept together."""

    def __init__(self, config, log=None) -> None:
        super().__init__(config, log)
        self._unit_cost: dict[str, float] | None = None

    def _split_scope(self, nodeid: str) -> str:
        file = _file(nodeid)
        if file in SPREAD:
            return nodeid
        return SHARE_A_WORKER.get(file, file)

    def _assign_work_unit(self, node) -> None:
        if self._unit_cost is None:     # the first assignment: the collection is complete
            in_file: dict[str, int] = {}
            for nodeid in self.collection or ():
                in_file[_file(nodeid)] = in_file.get(_file(nodeid), 0) + 1

            def test_cost(nodeid: str) -> float:
                file = _file(nodeid)
                return COST_S[file] / in_file[file] if file in COST_S else PER_TEST_S

            self._unit_cost = {scope: sum(map(test_cost, unit)) for scope, unit in self.workqueue.items()}
        costliest = max(self.workqueue, key=self._unit_cost.__getitem__)
        self.workqueue.move_to_end(costliest, last=False)
        super()._assign_work_unit(node)


def make_scheduler(config, log):
    """The scheduler for --dist loadfile; None leaves any other --dist to xdist."""
    if config.getvalue("dist") == "loadfile":
        return CostFirstScheduling(config, log)
    return None
