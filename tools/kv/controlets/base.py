"""The controlet interface: replication and consistency as a pure state machine.

A controlet is one replica's protocol logic for one shard. It never touches sockets, files
or clocks: the node runtime (or a simulator) feeds it events -- a client operation, a
message from a peer replica -- and executes the actions it returns, in order:

  Apply(key, value, req)   write (value None: delete) to the local datalet; when `req` is
                           given, the runtime records on it whether the key existed (DEL's reply)
  Read(req)                read req.key from the local datalet and answer req with it
  Reply(req)               answer a completed write (OK for SET, the existed count for DEL)
  Fail(req, message)       answer with a RESP error
  Send(node, kind, fields) one-way message to another replica of the shard (FIFO per link)
  Forward(req, node)       this replica may not serve req: relay it to `node`, relay the answer
  Snapshot(node, token, seq)  stream this replica's whole datalet to `node` (catch-up): SNAPBEGIN,
                           SNAPDATA pairs, SNAPEND, on the same FIFO link as every later Send
  Reset()                  empty the local datalet (a replica about to receive a snapshot)
  SendStored(node, kind, key)  read `key`'s stored bytes and send (key, bytes) as `kind` (repair)
  Undo(seq)                restore every numbered write >= seq this replica applied, newest first,
                           from their before-images (an Apply with seq > 0 keeps one)
  Commit(seq)              writes numbered <= seq are final here: forget their before-images

Datalet operations are executed in issue order, and any action after a datalet operation
waits for it, so a Reply never precedes the write it reports. A failed datalet operation
fails its request and stops every Send computed before the failure was known (the
controlet learns it through on_apply_failed: a StreamFailure when the write was numbered, and
the strong controlets then undo the write on every replica, stream.py). Every peer message carries
the configuration epoch and arrives only over a connection authenticated with the cluster
secret; the runtime drops messages from another epoch (fencing), so a replica from an older
configuration can never change this one.

Time enters only through on_tick(now), which the runtime calls periodically: write timeouts
and catch-up retries are measured on that injected clock.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

from mlsyskit.core.config import require
from mlsyskit.tools.kv.redis import rmw

GET = "get"
EXISTS = "exists"
PUT = "put"
DEL = "del"
FLUSH = "flush"  # empty the shard (FLUSHALL sends one per shard), ordered like any write
RMW = "rmw"  # a read-modify-write command (INCR, SETNX, SET NX...): resolved to PUT/DEL where writes are ordered
WRITES = (PUT, DEL, RMW, FLUSH)
RMW_NEEDS_LOCAL = "ERR read-modify-write commands need a local datalet (memory or lmdb) at the shard's write point"


class Apply(NamedTuple):
    key: bytes
    value: bytes | None
    req: Any = None
    seq: int = 0  # > 0: the stream number of a write that may be undone (its before-image is kept)
    op: Any = None  # a delta (rmw.Command): the value is what it makes of the key, computed when applied


class Undo(NamedTuple):
    seq: int


class Commit(NamedTuple):
    seq: int


class StreamFailure(NamedTuple):
    """What on_apply_failed receives for a failed write: its stream number (0: not numbered; -n:
    an Undo(n) failed), the error, the client request it answers (None: a replicated write), its key."""

    seq: int
    error: str
    req: Any = None
    key: bytes | None = None


class Read(NamedTuple):
    req: Any


class Reply(NamedTuple):
    req: Any


class Fail(NamedTuple):
    req: Any
    message: str


class Send(NamedTuple):
    node: str
    kind: bytes
    fields: tuple


class Forward(NamedTuple):
    req: Any
    node: str


class Snapshot(NamedTuple):
    node: str
    token: int
    seq: int


class Reset(NamedTuple):
    pass


class SendStored(NamedTuple):
    node: str
    kind: bytes
    key: bytes


Action = Apply | Read | Reply | Fail | Send | Forward | Snapshot | Reset | SendStored | Undo | Commit

TRYAGAIN = "TRYAGAIN"  # Redis's "retry later" error class: the write's outcome is not known
FENCED = f"{TRYAGAIN} fenced:"  # refused before execution: the client refreshes its map and retries
# A replica that is not serving yet (catching up, aligning) refuses a new operation before it does
# anything with it: the client may count that as a definite failure (client.REFUSED_BEFORE_EXECUTION).
NOT_SERVING = f"{TRYAGAIN} not serving yet:"
RECONFIGURED = f"{TRYAGAIN} the shard was reconfigured while this operation waited; a write may still be applied"


@dataclass(frozen=True)
class ControletOptions:
    """Bounds every controlet keeps (seconds on the injected clock)."""

    write_timeout: float = 8.0  # unacknowledged by then: -TRYAGAIN; 2x the 4 s failure timeout (busy host)
    max_pending: int = 100_000  # writes and reads waiting on peers; past it new ones fail at once
    sync_timeout: float = 0.5  # catch-up: a source that has not started a snapshot by then is skipped
    anti_entropy_interval: float = 0.5  # aa-ec: one digest exchange with the next replica per interval
    log_bytes: int = 64 << 20  # ms-sc/ms-ec/aa-sc: recent stream messages kept for catch-up by log tail

    def __post_init__(self) -> None:
        require(self.write_timeout > 0, "write_timeout must be positive")
        require(self.max_pending >= 1, "max_pending must be at least 1")
        require(self.sync_timeout > 0, "sync_timeout must be positive")
        require(self.anti_entropy_interval > 0, "anti_entropy_interval must be positive")
        require(self.log_bytes >= 0, "log_bytes must be non-negative")


def op_code(op: str) -> bytes:
    return b"P" if op == PUT else b"F" if op == FLUSH else b"D"


def wire_write(req: Any, op: str, delta: bytes | None) -> tuple[bytes, bytes]:
    """(code, value) of a write in a stream message: R and the command for a delta (rmw.DELTAS),
    else P with the value, D or F with nothing."""
    return (b"R", delta) if delta is not None else (op_code(op), req.value or b"")


def value_of(code: bytes, value: bytes) -> bytes | None:
    """Wire form of a write: op code P carries a value, D (delete) carries an empty one."""
    return value if code == b"P" else None


def stored(code: bytes, key: bytes, value: bytes, req: Any = None, seq: int = 0) -> Action:
    """The datalet action of a replicated write: P put, D delete, F empty the datalet."""
    if code == b"F":
        return Reset()
    if code == b"R":
        return Apply(key, None, req, seq, rmw.from_delta(value))
    return Apply(key, value if code == b"P" else None, req, seq)


class Controlet(ABC):
    """One replica's protocol for one shard. `replicas` is the shard's replica list in role order."""

    name: ClassVar[str]
    topology: ClassVar[str]  # "ms" | "aa"
    consistency: ClassVar[str]  # "strong" | "eventual"
    time_per_op: ClassVar[bool] = False  # True: the runtime sets `now` before every client operation

    def __init__(self, node_id: str, replicas: Sequence[str], epoch: int,
                 options: ControletOptions | None = None, incarnation: int = 0) -> None:
        if node_id not in replicas:
            raise ValueError(f"{node_id!r} is not a replica of {list(replicas)}")
        self.node_id = node_id
        self.replicas = tuple(replicas)
        self.index = self.replicas.index(node_id)
        self.epoch = epoch
        self.others = tuple(r for r in self.replicas if r != node_id)
        self.options = options or ControletOptions()
        # Request ids and catch-up tokens start at incarnation << 32, so a message queued for an
        # earlier process of this replica (delivered after a restart) can never match a new one.
        self.incarnation = incarnation
        self.now = 0.0  # the injected clock's last reading (on_tick)
        # Injected by the runtime for a local (synchronous) datalet: read a key as applied here.
        self.read_local: Any = None

    @staticmethod
    @abstractmethod
    def write_targets(replicas: Sequence[str]) -> Sequence[str]:
        """Replicas that accept writes directly (smart clients send writes there)."""

    @staticmethod
    @abstractmethod
    def read_targets(replicas: Sequence[str]) -> Sequence[str]:
        """Replicas that serve reads directly."""

    @abstractmethod
    def on_client(self, req: Any) -> list[Action]:
        """A client operation (req.op in get/exists/put/del, req.key, req.value) reached this replica."""

    @abstractmethod
    def on_peer(self, src: str, kind: bytes, fields: Sequence[Any]) -> list[Action]:
        """A message from another replica of this shard (fields arrive as bytes on the wire)."""

    def on_quiet(self) -> list[Action]:
        """Every peer message that had arrived has been handled (the runtime's read is drained).

        A controlet may defer work to here that many messages can share, e.g. one cumulative
        ack for a run of writes instead of one ack each. Default: nothing deferred.
        """
        return []

    @property
    def ready(self) -> bool:
        """False while catching up: the runtime then refuses client operations with -TRYAGAIN."""
        return True

    def on_start(self) -> list[Action]:
        """This replica (re)started and may have missed writes: catch up before serving."""
        return []

    def on_tick(self, now: float) -> list[Action]:
        """Time passed (the runtime's clock): expire waits, retry catch-up, run anti-entropy."""
        self.now = now
        return []

    def on_link_lost(self, node: str) -> list[Action]:
        """The link to `node` gave up and discarded queued messages: they will never arrive."""
        return []

    def on_apply_failed(self, req: Any) -> list[Action]:
        """A datalet write failed: a StreamFailure (its req, when a client's, is already answered
        with the error), or None when the datalet could not be emptied (Reset)."""
        return []

    def fail_pending(self, message: str) -> list[Action]:
        """Fail every client request waiting on peers (their messages may be lost). Default: none wait."""
        return []

    def take_over(self, old: Controlet) -> list[Action]:
        """The shard map changed (epoch + 1) and this replica stays: continue from `old`, the same
        replica's controlet under the previous map. Default: fail what `old` was waiting on (its
        outcome is unknown) and catch up afresh, as after a restart."""
        return old.fail_pending(RECONFIGURED) + self.on_start()

    def resolve(self, req: Any) -> list[Action] | None:
        """At the shard's write point: turn a read-modify-write into the PUT/DEL it amounts to.

        Returns actions that answer the request instead (an error), or None when req is now a
        plain write whose Reply will carry the command's own answer (req.reply).
        """
        if self.read_local is None:
            return [Fail(req, RMW_NEEDS_LOCAL)]
        after, req.reply = rmw.apply(req.rmw, self.read_local(req.key))
        req.op, req.value = (PUT, after) if after is not None else (DEL, None)
        return None

    def serves_locally(self, op: str) -> bool:
        """True when this replica answers `op` from its own datalet with no coordination at all.

        The runtime may then skip the action machinery for that op (the hot path of a
        single-replica shard); the result is the same as running on_client's actions.
        """
        return False

    def state(self) -> dict[str, Any]:
        """Protocol counters for INFO and status tables."""
        return {"controlet": self.name, "epoch": self.epoch, "role_index": self.index}
