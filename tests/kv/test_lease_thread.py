"""Issue 22 item 3: the lease survives a starved event loop and still ends on time (node/beat.py,
agent.py's lease rule, control.py's renewed_late), on a virtual clock with no sockets and no
thread: the heartbeat thread's beats are driven by hand (HeartbeatThread.beat), and the "loop"
is one that never runs a callback, as a loop starved for seconds does not."""
from __future__ import annotations

from dataclasses import replace

from mlsyskit.core.clock import VirtualClock
from mlsyskit.tools.kv.coord.spec import parse_coordinator
from mlsyskit.tools.kv.node.agent import ControlAgent, become_learner
from mlsyskit.tools.kv.node.beat import HeartbeatThread
from mlsyskit.tools.kv.node.runtime import Node
from mlsyskit.tools.kv.shardmap import layout

SPEC = parse_coordinator("embedded://127.0.0.1:1", 0.5, 3)  # failure timeout 4 s (the floor)
TIMEOUT, MARGIN = SPEC.timeout_s, 0.25


class StarvedLoop:
    """An event loop that takes callbacks and never runs them: blocked for the whole test."""

    def __init__(self) -> None:
        self.queued: list = []

    def call_soon_threadsafe(self, fn, *args) -> None:
        self.queued.append((fn, args))


class Coordinator:
    """A coordinator client the test answers for: known/epoch per beat, or unreachable."""

    def __init__(self, epoch: int) -> None:
        self.last_epoch, self.known, self.reachable, self.beats = epoch, True, True, 0

    def heartbeat(self, node_id: str, applied) -> bool:
        if not self.reachable:
            raise ConnectionError("coordinator unreachable")
        self.beats += 1
        return self.known


def leased_node(clock: VirtualClock):
    """A 1x3 ms-sc member with an agent that has registered and holds a lease from t=0."""
    smap = layout("ms-sc", "memory", 1, 3, "127.0.0.1", [7001, 7002, 7003])
    node = Node(smap, "s0r2", None, clock=clock)
    agent = ControlAgent(node, SPEC, smap.nodes["s0r2"], 0, clock=clock, backend=object())
    assert node.fenced() is not None  # no lease before the first answered beat
    agent.registered, agent.valid_from = True, 0.0
    coord, loop = Coordinator(smap.epoch), StarvedLoop()
    agent.beater = HeartbeatThread(coord, "s0r2", SPEC.interval_s, node.applied, agent.answered, loop, clock)
    agent.beater.beat(clock.now())
    assert node.lease_until == float("-inf")  # answered: published, its callback not run ...
    assert node.fenced() is None  # ... and the request path takes it
    return node, agent, coord, loop


def test_a_loop_starved_for_10_s_keeps_the_lease_its_beats_earn() -> None:
    clock = VirtualClock(0.0)
    node, agent, coord, loop = leased_node(clock)
    node.lease_until = float("-inf")  # the callbacks never run: any lease is the thread's
    for _ in range(20):  # 10 s without one loop turn, the thread beating every 0.5 s
        clock.advance(SPEC.interval_s)
        agent.beater.beat(clock.now())
        assert node.fenced() is None, clock.now()  # the request path takes the newest answer
        assert clock.now() < node.lease_until <= clock.now() + TIMEOUT - MARGIN  # never past the rule
    assert coord.beats == 21 and len(loop.queued) >= 21  # none of the callbacks has run


def test_unanswered_beats_end_the_lease_on_time() -> None:
    clock = VirtualClock(0.0)
    node, agent, coord, _ = leased_node(clock)
    clock.advance(1.0)
    agent.beater.beat(clock.now())  # the last answered beat, sent at t=1
    coord.reachable = False
    while clock.now() < 1.0 + TIMEOUT - MARGIN - 1e-9:
        assert node.fenced() is None, clock.now()
        clock.advance(0.25)
        agent.beater.beat(clock.now())
    assert clock.now() == 1.0 + TIMEOUT - MARGIN  # the coordinator may fail it over from t=5
    assert "no current lease" in node.fenced()
    assert agent.beater.failures >= 10


def test_an_answer_that_leaves_the_node_out_renews_nothing() -> None:
    for change in ("not known", "newer epoch", "deposed", "stale registration"):
        clock = VirtualClock(0.0)
        node, agent, coord, _ = leased_node(clock)
        if change == "not known":  # the coordinator lost our liveness record
            coord.known = False
        elif change == "newer epoch":  # a map we have not fetched: maybe without us
            coord.last_epoch += 1
        elif change == "deposed":
            node.deposed = True
        else:
            agent.valid_from = 7.0  # registering again from t=7: the beats before it earn nothing
        for _ in range(12):
            clock.advance(SPEC.interval_s)
            agent.beater.beat(clock.now())
        assert node.fenced() is not None, change  # 6 s later: lapsed (or deposed) in every case
        assert node.lease_until <= TIMEOUT - MARGIN, change  # from the first beat at t=0, never later


def test_a_lease_never_moves_back_and_a_learner_gets_none() -> None:
    clock = VirtualClock(0.0)
    node, agent, coord, _ = leased_node(clock)
    assert node.renewed_late() and node.lease_until == TIMEOUT - MARGIN
    agent.answered(-1.0, True, coord.last_epoch)  # an older answer delivered late
    assert node.lease_until == TIMEOUT - MARGIN
    nodes = {n: a for n, a in node.map.nodes.items() if n != "s0r2"}
    without = replace(node.map, epoch=node.map.epoch + 1, shards=(("s0r0", "s0r1"),), nodes=nodes)
    become_learner(node, without, 0, start=False)  # failed over, copying a snapshot: serves no client
    coord.last_epoch = without.epoch  # "known at the current epoch" yet not a member
    for _ in range(4):
        clock.advance(SPEC.interval_s)
        agent.beater.beat(clock.now())
        assert node.fenced() is not None and node.lease_until == float("-inf")
