"""A deterministic simulator for one shard's controlets: no sockets, virtual time, seeded delays.

It executes the same actions the node runtime executes, against in-memory datalets, and
delivers peer messages over FIFO links with seeded random delays, so every interleaving is
reproducible from the seed. Client operations are recorded as an invoke/ok history. Faults:
`crash` (the replica's memory and data are gone; messages to it are lost and its peers'
links report the loss, as a real link that gives up does), `restart` (a new incarnation that
catches up), `partition`/`heal` (messages between two replicas are lost both ways), `pause`/
`resume` (SIGSTOP/SIGCONT: the replica handles nothing, not even its clock, until resumed; then
what arrived meanwhile first, as the node's event loop does), `reconfigure` (the coordinator's
next map: every member's controlet takes over from its previous one; messages carry their
sender's epoch and are dropped at a receiver under another one, as the runtime fences them), and
`run_for` advances time with clock ticks (timeouts, catch-up retries, anti-entropy).
"""
from __future__ import annotations

from typing import Any

from mlsyskit.core.sim import EventLoop, Seeds
from mlsyskit.tools.kv.client.history import History
from mlsyskit.tools.kv.controlets import controlet_class
from mlsyskit.tools.kv.controlets.aa_ec import visible as versioned_visible
from mlsyskit.tools.kv.controlets.base import DEL, EXISTS, GET, PUT, RMW, ControletOptions
from mlsyskit.tools.kv.datalets.memory import MemoryDatalet
from mlsyskit.tools.kv.node.interpreter import Interpreter

OPS = {"get": GET, "put": PUT, "del": DEL, "exists": EXISTS, "rmw": RMW}


class SimRequest:
    def __init__(self, process: int, op: str, key: bytes, value: bytes | None) -> None:
        self.process, self.op, self.key, self.value = process, OPS[op], key, value
        self.f = op  # recorded under the invoked name (a resolved read-modify-write becomes a put)
        self.existed = False
        self.done = False
        self.completions = 0
        self.result: Any = None
        self.rmw: list[bytes] | None = None
        self.reply: bytes | None = None


class SimShard:
    """R replicas of one shard running `controlet` over a simulated network."""

    def __init__(self, controlet: str, replicas: int = 3, seed: int = 0, epoch: int = 1,
                 max_delay: float = 1e-3, options: ControletOptions | None = None,
                 tick_interval: float = 0.05) -> None:
        self.cls = controlet_class(controlet)
        self.ids = [f"r{i}" for i in range(replicas)]
        self.epoch, self.options = epoch, options
        self.loop = EventLoop()
        self.rng = Seeds(seed).random(f"net-{controlet}")
        self.max_delay = max_delay
        self.tick_interval = tick_interval
        self.incarnations = dict.fromkeys(self.ids, 0)
        self.members = list(self.ids)  # the current map's replicas, in role order
        self.controlets = {n: self._controlet(n) for n in self.ids}
        self.stats = {"datalet_errors": 0, "sends_dropped": 0}
        self.datalets = {n: MemoryDatalet() for n in self.ids}
        self.interpreters = {n: Interpreter(self.datalets[n], SimTransport(self, n), self.stats) for n in self.ids}
        self.tasks: dict[str, set] = {n: set() for n in self.ids}  # a replica's running snapshot exports
        self.link_clock: dict[tuple[str, str], float] = {}
        self.down: set[str] = set()
        self.paused: dict[str, list] = {}  # a paused replica: what reached it meanwhile, in order
        self.cut: set[frozenset] = set()
        self.history = History(self.loop.clock)
        self.messages = 0
        self.lost = 0
        self.duplicate_completions = 0
        self.accepted: dict[str, set[SimRequest]] = {n: set() for n in self.ids}  # client connections per replica

    def _controlet(self, node: str):
        replicas = self.members if node in self.members else self.ids
        c = self.cls(node, replicas, self.epoch, self.options, incarnation=self.incarnations[node])
        c.read_local = lambda key: self.datalets[node].get_live(key)
        return c

    @property
    def data(self) -> dict[str, dict[bytes, bytes]]:
        """Each replica's stored pairs (its memory datalet's dict)."""
        return {n: d.data for n, d in self.datalets.items()}

    def submit(self, node: str, op: str, key: bytes, value: bytes | None = None, process: int = 0,
               delay: float = 0.0) -> SimRequest:
        """A client operation arriving at `node` after `delay` (virtual seconds)."""
        req = SimRequest(process, op, key, value)

        def arrive() -> None:
            self.history.invoke(process, op, key, value)
            if node in self.down:
                self._complete(req, ConnectionError("replica down"))
                return
            self.accepted[node].add(req)
            self._handle(node, lambda: self._client_op(node, req))

        self.loop.schedule(delay, arrive)
        return req

    def _client_op(self, node: str, req: SimRequest) -> None:
        if node not in self.members:  # deposed: refused before execution, as a fenced node does
            self._complete(req, RuntimeError("TRYAGAIN fenced: not in the shard map"))
            return
        self.controlets[node].now = self.loop.now()
        self._execute(node, self.controlets[node].on_client(req))

    def _handle(self, node: str, fn) -> None:
        """Run `fn` at `node` now, or when it resumes if it is paused."""
        if node in self.paused:
            self.paused[node].append(fn)
        else:
            fn()

    def run(self, until: float | None = None) -> None:
        self.loop.run(until=until)

    def answer(self, req: SimRequest, limit: float = 5.0, step: float = 0.05):
        """Run virtual time until `req` is answered (it must be, within `limit`: never a hang)."""
        waited = 0.0
        while not req.done:
            assert waited < limit, f"no answer after {limit}s of virtual time"
            self.run_for(step)
            waited += step
        return req.result

    def run_for(self, seconds: float) -> None:
        """Advance `seconds` of virtual time, ticking every replica's clock on the way."""
        end = self.loop.now() + seconds
        t = self.loop.now()
        while t < end:
            t = min(end, t + self.tick_interval)
            self.loop.schedule_at(t, self._tick_all)
        self.loop.run(until=end)

    def _tick_all(self) -> None:
        now = self.loop.now()
        for n in self.ids:
            if n not in self.down and n not in self.paused:
                self._execute(n, self.controlets[n].on_tick(now))

    # -- faults --------------------------------------------------------------------------
    def crash(self, node: str) -> None:
        self.down.add(node)
        self.paused.pop(node, None)  # what was queued at a stopped process dies with it
        self.tasks[node].clear()  # so do its tasks (a snapshot being exported)
        self.datalets[node] = MemoryDatalet()
        self.interpreters[node] = Interpreter(self.datalets[node], SimTransport(self, node), self.stats)
        for req in list(self.accepted[node]):  # their clients' connections break: outcome unknown
            self._complete(req, ConnectionError("connection lost"))
        for other in self.ids:
            if other != node and other not in self.down:
                self._execute(other, self.controlets[other].on_link_lost(node))

    def restart(self, node: str) -> None:
        self.down.discard(node)
        self.incarnations[node] += 1
        c = self.controlets[node] = self._controlet(node)
        self.paused.pop(node, None)  # a restart ends a pause; what was queued died with the process
        c.on_tick(self.loop.now())
        self._execute(node, c.on_start())

    def partition(self, a: str, b: str) -> None:
        self.cut.add(frozenset((a, b)))
        self._execute(a, self.controlets[a].on_link_lost(b))
        self._execute(b, self.controlets[b].on_link_lost(a))

    def heal(self) -> None:
        self.cut.clear()

    def pause(self, node: str) -> None:
        self.paused.setdefault(node, [])

    def resume(self, node: str) -> None:
        """SIGCONT: what reached the replica while it was stopped is handled first, then its clock."""
        for fn in self.paused.pop(node, []):
            fn()
        if node not in self.down:
            self._execute(node, self.controlets[node].on_tick(self.loop.now()))

    def reconfigure(self, replicas: list[str]) -> None:
        """The coordinator's next map (epoch + 1) with `replicas` in role order, e.g. after a failover.

        Every member's controlet takes over from its previous one (a new incarnation for request
        ids, as the node runtime does); a node left out keeps its old controlet and is refused by
        everyone (another epoch) and refuses its clients (deposed)."""
        self.epoch += 1
        self.members = list(replicas)
        olds = {}
        for node in replicas:  # every member holds the new map before any of them sends under it
            olds[node] = self.controlets[node]
            self.incarnations[node] += 1
            new = self.cls(node, replicas, self.epoch, self.options, incarnation=self.incarnations[node])
            new.read_local = lambda key, node=node: self.datalets[node].get_live(key)
            new.now = self.loop.now()
            self.controlets[node] = new
        for node in replicas:
            if node not in self.down:
                self._execute(node, self.controlets[node].take_over(olds[node]))

    def switch(self, controlet: str) -> None:
        """A live switch: the same replicas under another controlet (the next map). A replica that
        switches to aa-ec rebuilds its version table from its data first, as the node runtime does."""
        self.cls = controlet_class(controlet)
        self.reconfigure(self.members)
        for node in self.members:
            c = self.controlets[node]
            if getattr(c, "loading", False) and node not in self.down:
                for key, raw in list(self.data[node].items()):
                    c.on_load(key, raw)
                self._execute(node, c.on_loaded())

    # -- execution -----------------------------------------------------------------------
    def _complete(self, req: SimRequest, result: Any) -> None:
        for pending in self.accepted.values():
            pending.discard(req)
        req.completions += 1
        if req.done:
            self.duplicate_completions += 1
            return
        req.result, req.done = result, True
        f = req.f
        if isinstance(result, Exception):
            self.history.complete(req.process, "info" if req.op in (PUT, DEL, RMW) else "fail", f, req.key,
                                  None)
        else:
            self.history.complete(req.process, "ok", f, req.key, result if req.op is GET else req.value)

    def _deliver_later(self, src: str, dst: str, fn) -> None:
        """FIFO per link: a message never overtakes an earlier one on the same link."""
        t = max(self.loop.now() + self.rng.uniform(0, self.max_delay), self.link_clock.get((src, dst), 0.0))
        self.link_clock[(src, dst)] = t
        incarnation = self.incarnations[dst]

        def deliver() -> None:
            if dst in self.down or frozenset((src, dst)) in self.cut or self.incarnations[dst] != incarnation \
                    or src in self.down:
                self.lost += 1
                return
            self._handle(dst, fn)

        self.loop.schedule_at(t, deliver)

    def _send(self, src: str, dst: str, frame: tuple) -> None:
        self.messages += 1
        kind, fields, epoch = frame
        self._deliver_later(src, dst, lambda: self._peer(dst, src, kind, fields, epoch))

    def _spawn(self, node: str, work) -> None:
        """A task at `node` (a snapshot's export): one step per turn of the loop, as asyncio runs it,
        held while the replica is paused and gone with it when it crashes."""
        tasks = self.tasks[node]
        tasks.add(work)

        def step() -> None:
            if work not in tasks:
                work.close()
                return
            try:
                work.send(None)
            except StopIteration:
                tasks.discard(work)
                return
            self.loop.schedule(0.0, lambda: self._handle(node, step))

        self.loop.schedule(0.0, lambda: self._handle(node, step))

    def visible(self, node: str, raw: bytes | None) -> bytes | None:
        return versioned_visible(raw)  # aa-ec's records are read as they are under every controlet

    def values(self, node: str) -> dict[bytes, bytes]:
        """What clients read at `node` (aa-ec stores versions and tombstones with the values)."""
        out = {k: self.visible(node, v) for k, v in self.data[node].items()}
        return {k: v for k, v in out.items() if v is not None}

    def _execute(self, node: str, actions: list) -> None:
        self.interpreters[node].execute(actions)

    def _forward(self, src: str, req: SimRequest, dst: str) -> None:
        """A relayed request; if the target is unreachable the relay fails (as a link's call does)."""
        def arrive() -> None:
            if dst in self.down or frozenset((src, dst)) in self.cut:
                self._complete(req, ConnectionError("TRYAGAIN forward failed"))
                return
            self.accepted[dst].add(req)
            self._handle(dst, lambda: self._client_op(dst, req))

        t = self.loop.now() + self.rng.uniform(0, self.max_delay)
        self.loop.schedule_at(max(t, self.link_clock.get((src, dst), 0.0)), arrive)

    def _peer(self, dst: str, src: str, kind: bytes, fields: tuple, epoch: int) -> None:
        """One delivery is one drained read at the receiver: on_peer, then on_quiet."""
        if self.controlets[dst].epoch != epoch:  # fenced: sent under another map
            self.lost += 1
            return
        self._execute(dst, self.controlets[dst].on_peer(src, kind, fields))
        self._execute(dst, self.controlets[dst].on_quiet())

    def converged(self) -> bool:
        first = self.data[self.members[0]]
        return all(self.data[n] == first for n in self.members[1:])


def _wire(field: Any) -> bytes:
    """Fields cross the simulated wire as bytes, exactly as they would over RESP."""
    if isinstance(field, bytes):
        return field
    return str(field).encode()


class SimTransport:
    """A replica's side of the simulated network: the runtime's transport (node/runtime.py), with
    messages delivered by the event loop and answers recorded in the history."""

    def __init__(self, shard: SimShard, node: str) -> None:
        self.shard, self.node = shard, node

    def frame(self, kind: bytes, fields: tuple) -> tuple:
        return kind, tuple(_wire(f) for f in fields), self.shard.controlets[self.node].epoch

    def send(self, dst: str, frame: tuple) -> None:
        self.shard._send(self.node, dst, frame)

    def forward(self, req: SimRequest, dst: str) -> None:
        self.shard._forward(self.node, req, dst)

    def reply(self, req: SimRequest) -> None:
        result = req.reply if req.reply is not None else "OK" if req.op is PUT else int(req.existed)
        self.shard._complete(req, result)

    def answer(self, req: SimRequest, stored: bytes | None) -> None:
        value = self.shard.visible(self.node, stored)
        self.shard._complete(req, value if req.op is GET else value is not None)

    def fail(self, req: SimRequest, message: str) -> None:
        self.shard._complete(req, RuntimeError(message))

    def spawn(self, work) -> None:
        self.shard._spawn(self.node, work)

    def on_apply_failed(self, req: SimRequest | None) -> None:
        self.shard._execute(self.node, self.shard.controlets[self.node].on_apply_failed(req))
