"""After heal and quiescence: convergence of replicas and acknowledged writes that were lost.

Lost write: an acknowledged write w of key k is lost when the value finally read for k was
written by operations that all finished before w was invoked (or is 'absent' while no
delete could explain it): real time says w came later, yet the old state survived. A write
that was only possibly applied (`info`) can never be lost, but can explain a final value.
A final value that nobody ever wrote is a phantom. Convergence: all replicas of a shard
report the same BKV.DIGEST (key count and an order-independent hash of their data).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from mlsyskit.core.clock import Clock
from mlsyskit.tools.kv.check.model import Op


@dataclass
class LostWrites:
    lost: list[Op]  # acknowledged writes whose effect is gone
    phantoms: list[tuple[str, str]]  # (key, value) read but never written

    def explain(self, limit: int = 10) -> list[str]:
        lines = [f"lost acknowledged write: {op.key!r} {op.describe()}" for op in self.lost[:limit]]
        lines += [f"phantom value {value!r} read for key {key!r}, never written" for key, value in self.phantoms[:limit]]
        return lines


def lost_writes(ops_by_key: dict[str, list[Op]], final: dict[str, list[str | None]]) -> LostWrites:
    """final: key -> the value(s) finally read for it (one per replica or read target)."""
    lost: dict[int, Op] = {}
    phantoms = []
    for key, values in final.items():
        ops = ops_by_key.get(key, [])
        writes = [op for op in ops if op.f in ("put", "del")]
        acked = [op for op in writes if op.definite]
        for value in values:
            if value is None:
                writers = [op for op in writes if op.f == "del"]
                latest_finish = max([op.ret for op in writers], default=-math.inf)  # the initial state: -inf
            else:
                writers = [op for op in writes if op.f == "put" and op.arg == value]
                if not writers:
                    phantoms.append((key, value))
                    continue
                latest_finish = max(op.ret for op in writers)
            for w in acked:
                if w.call > latest_finish and w not in writers:
                    lost[w.id] = w
    return LostWrites(sorted(lost.values(), key=lambda op: op.call), phantoms)


async def converge(cluster, clock: Clock, deadline_s: float = 5.0, poll_s: float = 0.1) -> tuple[bool, float, dict]:
    """Poll replica digests until every shard's replicas agree; (converged, seconds, last digests)."""
    start = clock.now()
    while True:
        digests = await cluster.digests()
        if all(_agree([digests[n] for n in reps]) for reps in cluster.map.shards):
            return True, clock.now() - start, digests
        if clock.now() - start > deadline_s:
            return False, clock.now() - start, digests
        await clock.asleep(poll_s)


def _agree(values: list) -> bool:
    return None not in values and len(set(values)) == 1
