"""The node runtime: wires one controlet and one datalet to sockets.

A node is one replica of one shard (or, with no shard, a pure proxy). Client commands are
parsed by the front end into single-key Requests; the node routes each to the local
controlet when this node holds the key's shard, or forwards it to the right node
otherwise (proxy mode: any node answers any key). The controlet's actions are executed
here, in order (see controlets/base.py): datalet operations are issued at once and in
order; the remaining actions of a batch wait for the batch's datalet results.
"""
from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

import hiredis

from mlsyskit.core import __version__
from mlsyskit.tools.kv import resp
from mlsyskit.tools.kv.controlets import Controlet, controlet_class
from mlsyskit.tools.kv.controlets.base import DEL, EXISTS, GET, PUT, Apply, Fail, Forward, Read, Reply, Send
from mlsyskit.tools.kv.datalets import Datalet
from mlsyskit.tools.kv.links import Link
from mlsyskit.tools.kv.shardmap import ShardMap

PEER_MESSAGE = b"BKV.MSG"


class Request:
    """One single-key client operation; `complete` hands its encoded reply to whoever waits."""

    __slots__ = ("op", "key", "value", "conn", "payload", "existed", "parent", "index")

    def __init__(self, op: str, key: bytes, value: bytes | None, conn: Any, parent: Any = None,
                 index: int = 0) -> None:
        self.op, self.key, self.value, self.conn = op, key, value, conn
        self.payload: bytes | None = None
        self.existed = False
        self.parent, self.index = parent, index

    def complete(self, payload: bytes) -> None:
        self.payload = payload
        if self.parent is not None:
            self.parent.part_done(self)
        elif self.conn is not None:
            self.conn.slot_done(self)

    def frame(self) -> bytes:
        """The command that performs this operation on another node."""
        if self.op is PUT:
            return hiredis.pack_command((b"SET", self.key, self.value))
        return hiredis.pack_command(({GET: b"GET", EXISTS: b"EXISTS", DEL: b"DEL"}[self.op], self.key))


def write_reply(req: Request) -> bytes:
    return resp.OK if req.op is PUT else (resp.ONE if req.existed else resp.ZERO)


class Node:
    def __init__(self, shard_map: ShardMap, node_id: str | None, datalet: Datalet | None,
                 limits: resp.Limits | None = None) -> None:
        self.map = shard_map
        self.node_id = node_id
        self.limits = limits or resp.Limits()
        self.datalet = datalet
        self.shard = shard_map.shard_of_node(node_id) if node_id else None
        if node_id is not None and self.shard is None:
            raise ValueError(f"node {node_id!r} is not in the shard map")
        cls = controlet_class(shard_map.controlet)
        self.controlet_cls = cls
        self.controlet: Controlet | None = (
            cls(node_id, shard_map.shards[self.shard], shard_map.epoch) if node_id else None)
        self.epoch_bytes = str(shard_map.epoch).encode()
        self.src_bytes = (node_id or "proxy").encode()
        self.sync_datalet = datalet is not None and not datalet.is_async
        # Hot path: ops this replica answers from its own (synchronous) datalet, no actions needed.
        local = self.sync_datalet and self.controlet is not None
        self.fast_get = datalet.get if local and self.controlet.serves_locally(GET) else None
        self.fast_put = datalet.put if local and self.controlet.serves_locally(PUT) else None
        self.only_shard = self.shard is not None and len(shard_map.shards) == 1
        self.queue: deque[list] = deque()  # batches waiting on remote-datalet results
        self.links: dict[str, Link] = {}
        self.peer_names = {n.encode(): n for n in shard_map.nodes}  # src field -> node id, no decode per message
        self.quiet_due = False  # peer messages were handled in the current read: on_quiet follows
        # The frame of the last Send: a broadcast (ms-ec, aa-ec, aa-sc's SEQ) sends the same
        # fields to every other replica, so it is encoded once, not once per destination.
        self._sent_fields: tuple | None = None
        self._sent_kind = b""
        self._sent_frame = b""
        self.client_connections: set[Any] = set()
        self.server: asyncio.base_events.Server | None = None
        self.stats = {"commands": 0, "forwarded": 0, "peer_messages": 0, "fenced": 0, "errors": 0,
                      "connections": 0}

    # -- lifecycle -----------------------------------------------------------
    async def start(self, host: str | None = None, port: int | None = None) -> None:
        from mlsyskit.tools.kv.frontend import ClientConnection

        if self.datalet is not None:
            await self.datalet.open()
        if host is None or port is None:
            addr = self.map.nodes[self.node_id]
            host, port = addr.host, addr.port
        loop = asyncio.get_running_loop()
        self.server = await loop.create_server(lambda: ClientConnection(self), host, port,
                                               reuse_address=True, backlog=1024)

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
        for conn in list(self.client_connections):  # so nothing touches a closed datalet
            conn.close()
        for link in self.links.values():
            await link.close()
        if self.datalet is not None:
            await self.datalet.close()

    def link(self, node_id: str) -> Link:
        link = self.links.get(node_id)
        if link is None:
            addr = self.map.nodes[node_id]
            link = self.links[node_id] = Link(addr.host, addr.port)
        return link

    # -- client operations ---------------------------------------------------
    def owns(self, key: bytes) -> bool:
        return self.only_shard or (self.shard is not None and self.map.shard_for(key) == self.shard)

    def submit(self, req: Request) -> None:
        if self.only_shard:  # the key is ours: no ring lookup
            self.execute(self.controlet.on_client(req))
            return
        shard = self.map.shard_for(req.key)
        if shard == self.shard:
            self.execute(self.controlet.on_client(req))
            return
        replicas = self.map.shards[shard]
        targets = (self.controlet_cls.read_targets(replicas) if req.op is GET or req.op is EXISTS
                   else self.controlet_cls.write_targets(replicas))
        self.forward(req, targets[0])

    def forward(self, req: Request, node_id: str) -> None:
        self.stats["forwarded"] += 1
        fut = self.link(node_id).call_frame(req.frame())
        fut.add_done_callback(lambda f: req.complete(_relay(req, f)))

    def on_peer_message(self, cmd: list) -> None:
        """BKV.MSG epoch src kind fields...: one-way, no reply; other epochs are fenced off."""
        self.stats["peer_messages"] += 1
        if len(cmd) < 4 or self.controlet is None:
            return
        if cmd[1] != self.epoch_bytes:
            self.stats["fenced"] += 1
            return
        src = self.peer_names.get(cmd[2]) or cmd[2].decode(errors="replace")
        self.quiet_due = True
        self.execute(self.controlet.on_peer(src, cmd[3], cmd[4:]))

    def quiet(self) -> None:
        """The front end drained a read that carried peer messages: the controlet's deferred actions."""
        self.quiet_due = False
        if self.controlet is not None:
            self.execute(self.controlet.on_quiet())

    # -- executing controlet actions -------------------------------------------
    def execute(self, actions: list) -> None:
        if self.sync_datalet and not self.queue:
            for a in actions:
                self._run(a, None)
            return
        batch = []
        last = None
        for a in actions:
            kind = type(a)
            if kind is Apply:
                last = self._apply(a)
                batch.append((a, last))
            elif kind is Read:
                last = self._read(a.req)
                batch.append((a, last))
            else:
                batch.append((a, None))
        self.queue.append(batch)
        if isinstance(last, asyncio.Future) and not last.done():
            last.add_done_callback(self._drain)
        else:
            self._drain()

    def _drain(self, _f: Any = None) -> None:
        queue = self.queue
        while queue:
            batch = queue[0]
            for _, res in batch:
                if isinstance(res, asyncio.Future) and not res.done():
                    return
            queue.popleft()
            for a, res in batch:
                self._finish(a, res)

    def _finish(self, a: Any, res: Any) -> None:
        """Complete an action whose datalet operation (if any) has finished."""
        kind = type(a)
        if isinstance(res, asyncio.Future):
            if res.exception() is not None:
                self.stats["errors"] += 1
                req = a.req
                if req is not None:
                    req.complete(resp.error(f"datalet error: {res.exception()}"))
                return
            res = res.result()
        if kind is Apply:
            if a.req is not None:
                a.req.existed = bool(res)
        elif kind is Read:
            self._answer_read(a.req, res)
        else:
            self._run(a, None)

    def _apply(self, a: Apply) -> Any:
        if a.value is None:
            return self.datalet.delete(a.key)
        return self.datalet.put(a.key, a.value)

    def _read(self, req: Request) -> Any:
        return self.datalet.get(req.key) if req.op is GET else self.datalet.exists(req.key)

    def _answer_read(self, req: Request, value: Any) -> None:
        if req.op is GET:
            req.complete(resp.bulk(value))
        else:
            req.complete(resp.ONE if value else resp.ZERO)

    def _run(self, a: Any, _: Any) -> None:
        kind = type(a)
        if kind is Apply:
            res = self._apply(a)
            if a.req is not None:
                a.req.existed = bool(res)
        elif kind is Read:
            self._answer_read(a.req, self._read(a.req))
        elif kind is Reply:
            a.req.complete(write_reply(a.req))
        elif kind is Send:
            if a.fields is not self._sent_fields or a.kind is not self._sent_kind:  # held: ids stay unique
                self._sent_fields, self._sent_kind = a.fields, a.kind
                self._sent_frame = hiredis.pack_command(
                    (PEER_MESSAGE, self.epoch_bytes, self.src_bytes, a.kind, *a.fields))
            self.link(a.node).send(self._sent_frame)
        elif kind is Forward:
            self.forward(a.req, a.node)
        elif kind is Fail:
            a.req.complete(resp.error(a.message))

    # -- introspection -------------------------------------------------------
    def info(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "bespokv_version": __version__, "node_id": self.node_id or "proxy",
            "shard": -1 if self.shard is None else self.shard, "shards": len(self.map.shards),
            "replicas": len(self.map.shards[0]), "epoch": self.map.epoch, "controlet": self.map.controlet,
            "datalet": self.map.datalet, **{f"total_{k}": v for k, v in self.stats.items()}}
        size = getattr(self.datalet, "size", None)
        if size is not None:
            out["keys"] = size()
        if self.controlet is not None:
            out.update({k: v for k, v in self.controlet.state().items() if k not in out})
        return out


def _relay(req: Request, fut: asyncio.Future) -> bytes:
    """Re-encode a forwarded request's answer the way this op answers."""
    exc = fut.exception()
    if exc is not None:
        return resp.error(str(exc) if isinstance(exc, hiredis.ReplyError) else f"forward failed: {exc}")
    value = fut.result()
    if req.op is GET:
        return resp.bulk(value)
    if req.op is PUT:
        return resp.OK
    return resp.integer(int(value))
