"""The ZooKeeper coordinator backend (kazoo), for clusters that already run ZooKeeper 3.8.

Layout under a root path (default /bespokv):

    <root>/map                 the shard map as JSON; compare-and-set by znode version + epoch check
    <root>/members/<node>      persistent {"host", "port"}
    <root>/live/<node>         ephemeral: present while the node's ZooKeeper session lives
    <root>/leader/...          kazoo Lock recipe: the first contender leads, the others stand by

With a cluster secret every client authenticates (digest scheme, user `bespokv`, the secret as
password) and every znode it creates carries a digest ACL for that identity only: a client without
the secret can neither read nor change the map, membership, liveness or the leader lock. The
root's existing znodes get the ACL when an authenticated client opens them (`_protect`).

Liveness is the session: a node that dies (even by kill -9) loses its ephemeral znode once its
session times out, and a coordinator process that dies loses its place in the leader lock the
same way, so a standby takes over. `heartbeat` is therefore only a check that the znode exists.
"""
from __future__ import annotations

import json
import threading
from collections.abc import Callable

from mlsyskit.core.errors import RuntimeFailure
from mlsyskit.tools.kv.coord.base import Coordinator, EpochConflict, check_successor
from mlsyskit.tools.kv.shardmap import NodeAddr, ShardMap

try:
    from kazoo.client import KazooClient, KazooState
    from kazoo.exceptions import BadVersionError, KazooException, NoAuthError, NodeExistsError, NoNodeError
    from kazoo.handlers.threading import KazooTimeoutError
    from kazoo.security import make_digest_acl
except ImportError:  # pragma: no cover - reported when the backend is chosen
    KazooClient = None

    class KazooException(Exception):  # type: ignore[no-redef]  # so callers can name it without kazoo
        pass

ZK_USER = "bespokv"  # the digest identity every client of one cluster shares
INSTALL_HINT = "the zookeeper coordinator needs kazoo: pip install 'mlsyskit[kv]' (or pip install kazoo)"


class SessionStillLive(RuntimeFailure):
    """A node's liveness znode belongs to another session: an impostor, or this node's previous
    process killed less than a session timeout ago (then it goes once that session expires)."""


class ZkCoordinator(Coordinator):
    def __init__(self, hosts: str, root: str = "/bespokv", *, session_timeout_s: float = 4.0,
                 connect_timeout_s: float = 10.0, secret: bytes | None = None) -> None:
        if KazooClient is None:
            raise RuntimeFailure(INSTALL_HINT)
        self.root = root.rstrip("/") or "/bespokv"
        auth, acl = None, None
        if secret is not None:  # digest auth: the ACL holds only a hash of user:password
            auth = [("digest", f"{ZK_USER}:{secret.hex()}")]
            acl = [make_digest_acl(ZK_USER, secret.hex(), all=True)]
        self.acl = acl
        self.client = KazooClient(hosts=hosts, timeout=session_timeout_s, auth_data=auth, default_acl=acl)
        self._leading = threading.Event()
        self._lock_recipe = None
        try:
            self.client.start(timeout=connect_timeout_s)
        except KazooTimeoutError:
            self.client.close()
            raise RuntimeFailure(f"ZooKeeper at {hosts} not reachable within {connect_timeout_s:g} s") from None
        self.client.add_listener(self._on_state)
        try:
            for sub in ("members", "live", "leader"):
                self.client.ensure_path(f"{self.root}/{sub}")
            if acl is not None:
                self._protect()
        except NoAuthError:
            self.client.stop()
            self.client.close()
            raise RuntimeFailure(f"ZooKeeper refused access to {self.root}: it is protected by another "
                                 "cluster secret (or this client has none)") from None

    def _protect(self) -> None:
        """Put this cluster's ACL on the root and its fixed children (made before a secret was used,
        or by an older version): znodes created later inherit it through default_acl."""
        for path in (self.root, *(f"{self.root}/{sub}" for sub in ("members", "live", "leader", "map"))):
            try:
                if self.client.get_acls(path)[0] != self.acl:
                    self.client.set_acls(path, self.acl)
            except NoNodeError:
                continue

    def _on_state(self, state: str) -> None:
        # A lost session took our ephemeral lock znode with it: we no longer lead.
        if state == KazooState.LOST:
            self._leading.clear()

    # -- shard map ------------------------------------------------------------------------------
    def _read(self) -> tuple[ShardMap | None, int]:
        try:
            data, stat = self.client.get(f"{self.root}/map")
        except NoNodeError:
            return None, -1
        return ShardMap.from_json(data), stat.version

    def read_map(self) -> ShardMap | None:
        return self._read()[0]

    def initialize(self, shard_map: ShardMap) -> ShardMap:
        try:
            self.client.create(f"{self.root}/map", shard_map.to_json().encode())
        except NodeExistsError:
            return self.read_map()
        for node in shard_map.nodes.values():
            self._put_member(node)
        return shard_map

    def compare_and_set(self, expected_epoch: int, new_map: ShardMap) -> ShardMap:
        check_successor(expected_epoch, new_map)
        current, version = self._read()
        stored = None if current is None else current.epoch
        if stored != expected_epoch:
            raise EpochConflict(expected_epoch, stored)
        try:   # the version makes read-check-write atomic: a concurrent writer makes this fail
            self.client.set(f"{self.root}/map", new_map.to_json().encode(), version=version)
        except BadVersionError:
            raise EpochConflict(expected_epoch, self.read_map().epoch) from None
        return new_map

    # -- membership and liveness ----------------------------------------------------------------
    def _put_member(self, node: NodeAddr) -> None:
        data = json.dumps({"host": node.host, "port": node.port}).encode()
        path = f"{self.root}/members/{node.node_id}"
        try:
            self.client.create(path, data)
        except NodeExistsError:
            self.client.set(path, data)

    def register(self, node: NodeAddr) -> None:
        """Called by the node itself, on its own session: its ephemeral znode is its liveness."""
        self._put_member(node)
        try:
            self.client.create(f"{self.root}/live/{node.node_id}", b"", ephemeral=True)
        except NodeExistsError:
            stat = self.client.exists(f"{self.root}/live/{node.node_id}")
            if stat is None or stat.ephemeralOwner == self.client.client_id[0]:
                return   # ours already, or gone between the two calls (the next register recreates it)
            raise SessionStillLive(f"node {node.node_id} is already live in another session "
                                   "(wait for that session to expire)") from None

    def members(self) -> dict[str, NodeAddr]:
        out = {}
        for n in self.client.get_children(f"{self.root}/members"):
            try:
                a = json.loads(self.client.get(f"{self.root}/members/{n}")[0])
            except NoNodeError:
                continue
            out[n] = NodeAddr(n, a["host"], int(a["port"]))
        return out

    def heartbeat(self, node_id: str, applied: int | None = None) -> bool:
        path = f"{self.root}/live/{node_id}"
        if applied is None:
            return self.client.exists(path) is not None
        try:
            self.client.set(path, str(applied).encode())
        except NoNodeError:
            return False
        return True

    def applied(self) -> dict[str, int]:
        out = {}
        for n in self.client.get_children(f"{self.root}/live"):
            try:
                data = self.client.get(f"{self.root}/live/{n}")[0]
            except NoNodeError:
                continue
            if data.isdigit():
                out[n] = int(data)
        return out

    def live(self) -> list[str]:
        return sorted(self.client.get_children(f"{self.root}/live"))

    def watch_live(self, callback: Callable[[list[str]], None]) -> None:
        """Call `callback(sorted live nodes)` now and on every change (kazoo's thread)."""
        self.client.ChildrenWatch(f"{self.root}/live", lambda children: callback(sorted(children)))

    # -- leader election ------------------------------------------------------------------------
    def campaign(self, candidate: str, timeout_s: float | None) -> bool:
        if self._lock_recipe is None:
            self._lock_recipe = self.client.Lock(f"{self.root}/leader", candidate)
        try:
            got = self._lock_recipe.acquire(blocking=True, timeout=timeout_s)
        except (KazooTimeoutError, KazooException):
            got = False
        if got:
            self._leading.set()
        return got

    def is_leader(self) -> bool:
        return self._leading.is_set()

    def leader(self) -> str | None:
        contenders = self.client.Lock(f"{self.root}/leader").contenders()
        return contenders[0] if contenders else None

    def close(self) -> None:
        self._leading.clear()
        try:
            if self._lock_recipe is not None:
                self._lock_recipe.release()
        except KazooException:
            pass
        self.client.stop()
        self.client.close()
