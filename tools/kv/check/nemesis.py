"""The nemesis: a seeded schedule of faults (pure) and the loop that inflicts them.

One fault at a time, as in Jepsen's standard nemeses, so a failing history points at one
cause: each round shuffles the requested kinds, picks a victim per fault and holds it for
a seeded time, then heals and waits a seeded gap before the next.

  kill       kill -9 the node; start it again when the fault ends
  pause      SIGSTOP the node; SIGCONT when the fault ends
  partition  cut every replica link to and from the node (fault proxies); reconnect at the end
  restart    stop the node cleanly (SIGTERM) and start it again at once
  coordinator-kill  kill -9 the coordinator; start it again when the fault ends (the embedded
             one resumes from its SQLite state; nodes keep serving on their leases meanwhile)

With a coordinator, a kill or pause that outlasts the failure timeout is a failover: the victim
leaves the map, and rejoins as a replacement when it comes back.
"""
from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from mlsyskit.core.clock import Clock

FAULTS = ("kill", "pause", "partition", "restart", "coordinator-kill")


@dataclass(frozen=True)
class Fault:
    kind: str
    node: str
    gap: float  # quiet time before it starts, s
    hold: float  # how long it lasts, s (restart: 0)


def parse_faults(text: str) -> tuple[str, ...]:
    """'kill,pause' -> ('kill', 'pause'); 'none' or '' -> no faults."""
    kinds = tuple(k.strip() for k in text.split(",") if k.strip() and k.strip() != "none")
    unknown = [k for k in kinds if k not in FAULTS]
    if unknown:
        raise ValueError(f"unknown nemesis {', '.join(unknown)}; choose from {', '.join(FAULTS)} (or none)")
    return tuple(dict.fromkeys(kinds))


def schedule(kinds: tuple[str, ...], nodes: list[str], seed: int, hold: tuple[float, float] = (0.6, 1.8),
             gap: tuple[float, float] = (0.3, 1.0)) -> Iterator[Fault]:
    """Rounds of the requested kinds in seeded order, for ever (the caller stops it)."""
    rng = random.Random(seed)
    while kinds:
        for kind in rng.sample(kinds, len(kinds)):
            yield Fault(kind, rng.choice(nodes), rng.uniform(*gap), 0.0 if kind == "restart" else rng.uniform(*hold))


class Nemesis:
    """Runs a schedule against a ProcCluster until `done()` and every kind happened once."""

    def __init__(self, cluster, kinds: tuple[str, ...], seed: int, clock: Clock,
                 log: Callable[[str], None] = lambda _: None, **timing) -> None:
        self.cluster, self.kinds, self.clock, self.log = cluster, kinds, clock, log
        self.faults = schedule(kinds, cluster.nodes, seed, **timing)
        self.done_kinds: set[str] = set()
        self.journal: list[dict] = []  # what happened when, for the report and the history file
        self.t0 = clock.now()

    @property
    def covered(self) -> bool:
        return self.done_kinds >= set(self.kinds)

    async def run(self, done: Callable[[], bool]) -> None:
        for fault in self.faults:
            if done() and self.covered:
                return
            await self.clock.asleep(fault.gap)
            await self.inflict(fault)
            self.done_kinds.add(fault.kind)

    async def inflict(self, fault: Fault) -> None:
        c, node = self.cluster, fault.node
        self._note("start", fault)
        if fault.kind == "kill":
            await c.kill(node)
            await self.clock.asleep(fault.hold)
            await c.start_node(node)
        elif fault.kind == "pause":
            c.pause(node)
            await self.clock.asleep(fault.hold)
            c.resume(node)
        elif fault.kind == "partition":
            await c.isolate(node)
            await self.clock.asleep(fault.hold)
            await c.heal()
        elif fault.kind == "restart":
            await c.terminate(node)
            await c.start_node(node)
        elif fault.kind == "coordinator-kill":
            await c.kill_coordinator()
            await self.clock.asleep(fault.hold)
            await c.restart_coordinator()
        self._note("end", fault)

    def _note(self, phase: str, fault: Fault) -> None:
        t = self.clock.now() - self.t0
        self.journal.append({"time": round(t, 4), "at": self.clock.now(), "phase": phase, "fault": fault.kind,
                             "node": fault.node})
        self.log(f"nemesis {fault.kind} {fault.node} {phase} at {t:.2f}s")
