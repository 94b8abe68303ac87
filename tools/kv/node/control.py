"""The control-plane half of a node (mixed into Node): lease, fencing by epoch, reconfiguration.

With a coordinator (controlplane.ControlAgent) a node follows the shard map: a newer map rebuilds
the controlet from the old one's state (reconfigure); peer messages of an older epoch are dropped
and those of a newer one are held until the node has fetched the map; and the node serves
clients only while it is in the map and holds a lease (fenced()). Without a coordinator
lease_until stays None and none of this costs anything on the request path. A lease found lapsed
is first renewed, if it can be, from the heartbeat thread's newest answer (renewed_late; the rule
in agent.py), so a loop starved for longer than the lease does not refuse clients the coordinator
has kept in the map.
"""
from __future__ import annotations

import asyncio
import secrets as _secrets

from mlsyskit.tools.kv.controlets import controlet_class
from mlsyskit.tools.kv.controlets.base import FENCED, TRYAGAIN
from mlsyskit.tools.kv.shardmap import ShardMap

MAX_HELD_MESSAGES = 100_000  # peer messages from a newer epoch waiting for this node to fetch its map


class LeaseExpired(Exception):
    """A fast-path read found the lease lapsed: the connection is closed rather than served stale."""


class ControlledNode:
    """Methods of Node that concern the control plane; the state they use is set in Node.__init__."""

    def _leased_get(self, key: bytes) -> bytes | None:
        # Checked per read: after a SIGSTOP the event loop hands over queued client data before any
        # timer runs, so only a check at the read itself keeps a deposed tail from answering.
        if self.clock.now() >= self.lease_until and not self.renewed_late():
            raise LeaseExpired(f"{self.node_id}: lease lapsed")
        return self.peek(key)  # as the unleased fast path reads (a live value: the caller takes its record)

    def renewed_late(self) -> bool:
        """The lease looked lapsed: take the heartbeat thread's newest answer (on this loop, against
        the current map), and say whether the lease now holds."""
        if self.agent is not None:
            self.agent.take_thread_answer()
        return self.clock.now() < self.lease_until

    # -- the control plane ------------------------------------------------------
    def fenced(self) -> str | None:
        """Why this node may not serve clients now (None: it may)."""
        if self.deposed:
            return f"{FENCED} {self.node_id} is not in the shard map (epoch {self.map.epoch}); refresh the map"
        if self.lease_until is not None and self.clock.now() >= self.lease_until and not self.renewed_late():
            return f"{FENCED} {self.node_id} has no current lease from the coordinator; retry"
        return None

    def renew_lease(self, until: float) -> None:
        if self.lease_until is None:
            self._fast_ready = None  # the fast read path now checks the lease
        self.lease_until = until
        self._refresh_fast_paths()

    def applied(self) -> int | None:
        """This replica's count of applied writes (heartbeats carry it; ms-ec promotes the highest)."""
        return None if self.deposed else getattr(self.controlet, "applied", None)

    def reconfigure(self, new_map: ShardMap) -> None:
        """A newer shard map: rebuild the controlet from the old one's state (or stand down)."""
        if new_map.epoch <= self.map.epoch:
            return
        self.reconfigurations += 1
        old_map, self.map = self.map, new_map
        self.epoch_bytes = str(new_map.epoch).encode()
        self.peer_names = {n.encode(): n for n in new_map.nodes}
        self.cluster_nodes.update(new_map.nodes)  # a learner of a later map may authenticate here
        for nid in list(self.links):
            addr, was = new_map.nodes.get(nid), old_map.nodes.get(nid)
            if addr is None or (was is not None and (addr.host, addr.port) != (was.host, was.port)):
                self._close_link(nid)
        if new_map.controlet != old_map.controlet:  # a live switch of topology or consistency
            self.controlet_cls = controlet_class(new_map.controlet)
            self.visible = getattr(self.controlet_cls, "visible", None)
            self.time_per_op = self.controlet_cls.time_per_op and self.node_id is not None
        if self.node_id is None:  # the proxy only routes by the map
            self.only_shard = False
            return
        shard = new_map.shard_of_node(self.node_id)
        old = self.controlet
        if shard is None:
            if not self.deposed and old is not None:
                self.execute(old.fail_pending(f"{TRYAGAIN} reconfigured: this replica left the shard; "
                                              "the write may still be applied"))
            self.deposed = True
        else:
            was_member = not self.deposed
            self.deposed = False
            self.shard = shard
            self.only_shard = len(new_map.shards) == 1
            new = self.controlet_cls(self.node_id, new_map.shards[shard], new_map.epoch, self.options,
                                     incarnation=_secrets.randbits(30))
            if self.sync_datalet_of(self.datalet):
                new.read_local = self.datalet.get_live
            new.now = self.clock.now()
            self.controlet = new
            self.execute(new.take_over(old) if was_member and old is not None else new.on_start())
            if getattr(new, "loading", False):
                self._load_versions(new)
            self.quiet()
        self._fast_ready = None
        self._refresh_fast_paths()
        held, self.held = self.held, []
        for epoch, peer, peer_bytes, cmd in held:
            if epoch >= new_map.epoch:
                self.on_peer_message(peer, peer_bytes, cmd)

    def _load_versions(self, controlet) -> None:
        """A switch to aa-ec: build its version table from the datalet before it serves (the keys
        stored without a version read as (0, 0)). A Reset meanwhile (a snapshot) ends the scan."""
        async def scan() -> None:
            generation = controlet.load_generation
            async for key, raw in self.datalet.export_pairs():
                if controlet.load_generation != generation or self.controlet is not controlet:
                    return
                controlet.on_load(key, raw)
            if controlet.load_generation == generation and self.controlet is controlet:
                self.execute(controlet.on_loaded())
                self._fast_ready = None
                self._refresh_fast_paths()

        task = asyncio.get_running_loop().create_task(scan())
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def _close_link(self, node_id: str) -> None:
        link = self.links.pop(node_id)
        task = asyncio.get_running_loop().create_task(link.close())
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def _other_epoch(self, peer: str, peer_bytes: bytes, cmd: list) -> None:
        """Older epoch: fenced off. Newer: hold it and fetch the map (admit's REFRESH_SELF)."""
        try:
            epoch = int(cmd[1])
        except ValueError:
            epoch = -1
        if epoch <= self.map.epoch or self.agent is None or len(self.held) >= MAX_HELD_MESSAGES:
            self.stats["fenced"] += 1
            return
        self.held.append((epoch, peer, peer_bytes, cmd))
        self.agent.refresh_soon()

