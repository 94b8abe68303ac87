"""A deterministic simulator for one shard's controlets: no sockets, virtual time, seeded delays.

It executes the same actions the node runtime executes, against in-memory datalets, and
delivers peer messages over FIFO links with seeded random delays, so every interleaving is
reproducible from the seed. Client operations are recorded as an invoke/ok history. This
is what tests use to check the protocols' promises (acknowledged writes are visible,
replicas converge) and what a nemesis and a linearizability checker will drive.
"""
from __future__ import annotations

from typing import Any

from mlsyskit.core.sim import EventLoop, Seeds
from mlsyskit.tools.kv.controlets import controlet_class
from mlsyskit.tools.kv.controlets.base import DEL, EXISTS, GET, PUT, Apply, Fail, Forward, Read, Reply, Send
from mlsyskit.tools.kv.history import History

OPS = {"get": GET, "put": PUT, "del": DEL, "exists": EXISTS}


class SimRequest:
    def __init__(self, process: int, op: str, key: bytes, value: bytes | None) -> None:
        self.process, self.op, self.key, self.value = process, OPS[op], key, value
        self.existed = False
        self.done = False
        self.result: Any = None


class SimShard:
    """R replicas of one shard running `controlet` over a simulated network."""

    def __init__(self, controlet: str, replicas: int = 3, seed: int = 0, epoch: int = 1,
                 max_delay: float = 1e-3) -> None:
        cls = controlet_class(controlet)
        self.ids = [f"r{i}" for i in range(replicas)]
        self.loop = EventLoop()
        self.rng = Seeds(seed).random(f"net-{controlet}")
        self.max_delay = max_delay
        self.controlets = {n: cls(n, self.ids, epoch) for n in self.ids}
        self.data: dict[str, dict[bytes, bytes]] = {n: {} for n in self.ids}
        self.link_clock: dict[tuple[str, str], float] = {}
        self.history = History(self.loop.clock)
        self.messages = 0

    def submit(self, node: str, op: str, key: bytes, value: bytes | None = None, process: int = 0,
               delay: float = 0.0) -> SimRequest:
        """A client operation arriving at `node` after `delay` (virtual seconds)."""
        req = SimRequest(process, op, key, value)

        def arrive() -> None:
            self.history.invoke(process, op, key, value)
            self._execute(node, self.controlets[node].on_client(req))

        self.loop.schedule(delay, arrive)
        return req

    def run(self, until: float | None = None) -> None:
        self.loop.run(until=until)

    def _complete(self, req: SimRequest, result: Any) -> None:
        req.result, req.done = result, True
        f = next(k for k, v in OPS.items() if v is req.op)
        self.history.complete(req.process, "ok", f, req.key, result if req.op is GET else req.value)

    def _deliver_later(self, src: str, dst: str, fn) -> None:
        """FIFO per link: a message never overtakes an earlier one on the same link."""
        t = max(self.loop.now() + self.rng.uniform(0, self.max_delay), self.link_clock.get((src, dst), 0.0))
        self.link_clock[(src, dst)] = t
        self.loop.schedule_at(t, fn)

    def _execute(self, node: str, actions: list) -> None:
        data = self.data[node]
        for a in actions:
            kind = type(a)
            if kind is Apply:
                existed = a.key in data
                if a.value is None:
                    data.pop(a.key, None)
                else:
                    data[a.key] = a.value
                if a.req is not None:
                    a.req.existed = existed
            elif kind is Read:
                req = a.req
                self._complete(req, data.get(req.key) if req.op is GET else req.key in data)
            elif kind is Reply:
                self._complete(a.req, "OK" if a.req.op is PUT else int(a.req.existed))
            elif kind is Fail:
                self._complete(a.req, RuntimeError(a.message))
            elif kind is Send:
                self.messages += 1
                dst, msg_kind, fields = a.node, a.kind, tuple(_wire(f) for f in a.fields)
                self._deliver_later(node, dst, lambda dst=dst, k=msg_kind, f=fields, src=node: self._peer(
                    dst, src, k, f))
            elif kind is Forward:
                req, dst = a.req, a.node
                self._deliver_later(node, dst, lambda req=req, dst=dst: self._execute(
                    dst, self.controlets[dst].on_client(req)))

    def _peer(self, dst: str, src: str, kind: bytes, fields: tuple) -> None:
        """One delivery is one drained read at the receiver: on_peer, then on_quiet."""
        self._execute(dst, self.controlets[dst].on_peer(src, kind, fields))
        self._execute(dst, self.controlets[dst].on_quiet())

    def converged(self) -> bool:
        first = self.data[self.ids[0]]
        return all(self.data[n] == first for n in self.ids[1:])


def _wire(field: Any) -> bytes:
    """Fields cross the simulated wire as bytes, exactly as they would over RESP."""
    if isinstance(field, bytes):
        return field
    return str(field).encode()
