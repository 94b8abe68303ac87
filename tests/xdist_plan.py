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
# 2-core machine, pytest's ~5 s start-up included; ~ marks an estimate from wall times; refreshed
# 2026-12-02). Only the order depends on these: a wrong figure makes the run slower, never wrong. Refresh: /usr/bin/time or a cgroup around `pytest -n 0 FILE`.
COST_S: dict[str, float] = {
    "tests/demo/test_demo.py": 127,              # (--quick: 00-core 10, 10-tencache 30, 20-fl 25, 30-marble 50, 40-bespokv 23)
    "tests/kv/test_failover.py": 51,
    # Ray's files are wall seconds (fresh-clone CI, 2026-12-02 session 5: each Ray start waited 30-80 s for its
    # node, little of it CPU): as CPU figures (21, 32) they were handed out mid-run and ran as the tail.
    "tests/fl/test_ray_backend.py": 85,
    "tests/fl/test_ray_local.py": 85,
    "tests/sched/test_daemon_slurmlike.py": 32,
    "tests/kv/test_cli.py": 48,
    "tests/sched/test_daemon.py": 29,
    "tests/fl/test_real_federation.py": 20,
    "tests/sched/test_profile.py": 27,
    "tests/kv/test_check_repro.py": 17,
    "tests/kv/test_check.py": 28,
    "tests/sched/test_bench.py": 16,
    "tests/fl/test_real_scheduling.py": 31,
    "tests/sched/test_cli.py": 18,
    "tests/sched/test_daemon_preempt.py": 8,
    "tests/sched/test_daemon_scheduler.py": 7.5,
    "tests/fl/test_real_tls_door.py": 6,
    "tests/kv/test_check_client.py": 8,
    "tests/sched/test_executor_local.py": 5,
    "tests/kv/test_failover_node.py": 8,
    "tests/offload/test_tencache_ranks.py": 120,  # wall (same run): 3 processes importing torch, then gloo
    "tests/offload/test_tencache_safety.py": 33,
    "tests/offload/test_tencache_lazy.py": 21,
    "tests/offload/test_tencache_memory.py": 16,
    "tests/offload/test_tencache_errors.py": 23,
    "tests/kv/test_matrix.py": 7,
    "tests/core/test_help_pages.py": 10,
    "tests/fl/test_chaos.py": 17,
    "tests/kv/test_switch.py": 27.5,
    "tests/kv/test_supervisor.py": 21,
    "tests/core/test_packaging_cli.py": 13.5,
    "tests/kv/test_redis_lost.py": 15,
    "tests/kv/test_requirepass.py": 14,
    "tests/kv/test_multihost.py": 14,
    "tests/kv/test_redis_benchmark.py": 10,
    "tests/fl/test_identity.py": 6,
    "tests/fl/test_loopback.py": 91,
    "tests/fl/test_server_inprocess.py": 11,
    "tests/fl/test_scheduling_harness.py": 14,
    "tests/kv/test_coord_zk.py": 19,
    "tests/kv/test_ride_through.py": 19,
    "tests/kv/test_bench_script.py": 15,
    "tests/kv/test_coord_server.py": 11,
    "tests/kv/test_copy_then_join.py": 9,
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
