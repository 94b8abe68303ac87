"""`aa-ec`: active-active, eventual consistency by versioned last-writer-wins.

Any replica accepts a write, stamps it with a version (counter, replica index), applies it,
answers at once and propagates it to the other replicas asynchronously. A replica applies
an incoming write only if its version is greater than the one it holds for the key.
Versions are totally ordered (ties on the counter broken by replica index), so once every
write has reached every replica they all hold the value of the greatest version, whatever
the delivery order. The counter is a hybrid logical clock: max(counter + 1, now in µs), with
`now` read for every write, so a replica that restarted empty still stamps its new writes
above everything older, and of two writes a client makes one after the other at different
replicas the later one wins (up to clock skew, nil on one machine).

Versions are durable with the data: the datalet stores `version + value` in one value
(a delete stores a versioned tombstone), so a restart reloads them (on_load) and a crash
can never separate a value from its version. Reads strip the version (visible()).

Anti-entropy repairs what propagation lost (a link that gave up, a replica that was down):
every anti_entropy_interval a replica sends the next replica 64 bucket digests of its
(key, version) table (buckets by key hash); the peer answers the versions of every bucket
that differs, and each side then sends the other whatever it holds newer (AEPUT, the stored
bytes as they are). Replicas that agree exchange one 512-byte message per interval.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mlsyskit.tools.kv.controlets.aa_ec_entry import ALIGNING, ENTRY_KINDS, REFUSED_ALIGNING, Entering
from mlsyskit.tools.kv.controlets.base import (
    EXISTS,
    FLUSH,
    GET,
    PUT,
    RMW,
    Action,
    Apply,
    Controlet,
    Fail,
    Read,
    Reply,
    Send,
    SendStored,
    StreamFailure,
)
from mlsyskit.tools.kv.redis import values
from mlsyskit.tools.kv.shardmap import hash64

BUCKETS = 64
MAX_BUCKETS_PER_ROUND = 8  # bounds one repair message; the rest differs again next round


def encode(counter: int, index: int, value: bytes | None) -> bytes:
    return values.wrap_versioned(counter, index, value)


def decode(raw: bytes) -> tuple[tuple[int, int], bytes | None]:
    """(version, value or None for a tombstone); bytes stored without a version are version (0, 0)."""
    return values.unwrap_versioned(raw)


def visible(raw: bytes | None) -> bytes | None:
    """The value a client reads from stored bytes (None: absent or deleted)."""
    if raw is None:
        return None
    return decode(raw)[1]


class LastWriterWins(Entering, Controlet):
    name = "aa-ec"
    topology = "aa"
    consistency = "eventual"
    visible = staticmethod(visible)
    time_per_op = True
    versioned = True  # its datalet holds versioned records (a switch away must converge them first)

    def __init__(self, node_id: str, replicas: Sequence[str], epoch: int, options: Any = None,
                 incarnation: int = 0) -> None:
        super().__init__(node_id, replicas, epoch, options, incarnation)
        self.counter = 0
        self.versions: dict[bytes, tuple[int, int, bool]] = {}  # key -> (counter, index, live)
        self.digests = [0] * BUCKETS
        self.bucket_keys: list[set[bytes]] = [set() for _ in range(BUCKETS)]
        self.stale_dropped = 0
        self.repaired = 0
        self.next_ae = 0.0
        self.ae_round = 0
        self.init_entry()

    @staticmethod
    def write_targets(replicas: Sequence[str]) -> Sequence[str]:
        return replicas

    @staticmethod
    def read_targets(replicas: Sequence[str]) -> Sequence[str]:
        return replicas

    def serves_locally(self, op: str) -> bool:
        return False  # stored bytes carry a version: reads go through visible()

    # -- the version table and its bucket digests ----------------------------------------
    def _set_version(self, key: bytes, version: tuple[int, int, bool]) -> None:
        bucket = hash64(key) % BUCKETS
        old = self.versions.get(key)
        if old is not None:
            self.digests[bucket] ^= _entry_hash(key, old)
        self.versions[key] = version
        self.digests[bucket] ^= _entry_hash(key, version)
        self.bucket_keys[bucket].add(key)

    def reset_table(self) -> None:
        self.versions, self.digests = {}, [0] * BUCKETS
        self.bucket_keys = [set() for _ in range(BUCKETS)]

    def on_load(self, key: bytes, raw: bytes) -> None:
        """The runtime reloads the table from the datalet (at start-up: versions are durable; after a
        switch to aa-ec: unversioned keys). A newer version merged meanwhile is kept."""
        (counter, index), value = decode(raw)
        self.counter = max(self.counter, counter)
        mine = self.versions.get(key)
        if mine is None or (counter, index) > mine[:2]:
            self._set_version(key, (counter, index, value is not None))

    def merge_pair(self, key: bytes, raw: bytes) -> list[Action]:
        return self._merge(key, raw)

    def _merge(self, key: bytes, raw: bytes) -> list[Action]:
        (counter, index), value = decode(raw)
        self.counter = max(self.counter, counter)
        mine = self.versions.get(key)
        if mine is not None and (counter, index) <= mine[:2]:
            self.stale_dropped += 1
            return []
        self._set_version(key, (counter, index, value is not None))
        return [Apply(key, raw)]

    # -- events ------------------------------------------------------------------------------
    def on_client(self, req: Any) -> list[Action]:
        if not self.ready:
            return [Fail(req, REFUSED_ALIGNING)]
        op = req.op
        if op is GET or op is EXISTS:
            return [Read(req)]
        if op is RMW:
            return [Fail(req, "ERR read-modify-write commands are not supported by aa-ec: "
                              "last-writer-wins cannot order a read against concurrent writes")]
        if op is FLUSH:
            return [Fail(req, "ERR FLUSHALL is not supported by aa-ec: a flush would need a version "
                              "for every key of every replica (delete keys instead)")]
        self.counter = max(self.counter + 1, int(self.now * 1_000_000))
        key = req.key
        old = self.versions.get(key)
        req.existed = old is not None and old[2]
        value = req.value if op is PUT else None
        self._set_version(key, (self.counter, self.index, value is not None))
        raw = encode(self.counter, self.index, value)
        out: list[Action] = [Apply(key, raw, req), Reply(req)]
        fields = (key, raw)
        out.extend(Send(n, b"LWW", fields) for n in self.others)
        return out

    def on_peer(self, src: str, kind: bytes, fields: Sequence[Any]) -> list[Action]:
        if src not in self.others:
            return []
        if kind in ENTRY_KINDS:
            return self.on_entry_message(src, kind, fields)
        if kind == b"LWW" or kind == b"AEPUT":
            if kind == b"AEPUT":
                self.repaired += 1
            return self._merge(fields[0], fields[1])
        if kind == b"AEDIGEST":
            return self._answer_digest(src, fields[0])
        if kind == b"AEKEYS":
            return self._reconcile(src, int(fields[0]), fields[1:])
        if kind == b"AEPULL":
            return [SendStored(src, b"AEPUT", k) for k in fields if k in self.versions]
        return []

    def take_over(self, old: Controlet) -> list[Action]:
        """A new map. From aa-ec: the version table and alignment carry over; anti-entropy repairs
        what a failed replica had not propagated (nothing waits on peers here). From a replica that
        was leaving aa-ec (aa_ec_exit.py), the same with the aa-ec state it still held. From a
        numbered stream (a live switch): align first (aa_ec_entry.py)."""
        lww = old if getattr(old, "versioned", False) else getattr(old, "lww", None)
        if lww is not None:
            self.counter, self.versions, self.digests, self.bucket_keys = (
                lww.counter, lww.versions, lww.digests, lww.bucket_keys)
            self.stale_dropped, self.repaired = lww.stale_dropped, lww.repaired
            return (old.fail_pending(ALIGNING) if old is not lww else []) + self.carry_entry(lww)
        if hasattr(old, "applied") and hasattr(old, "upstream"):
            return self.enter_from_stream(old)
        return super().take_over(old)

    def on_tick(self, now: float) -> list[Action]:
        self.now = now
        out = self.tick_entry(now)
        if now < self.next_ae or not self.others:
            return out
        self.next_ae = now + self.options.anti_entropy_interval
        peer = self.others[self.ae_round % len(self.others)]
        self.ae_round += 1
        return out + [Send(peer, b"AEDIGEST", (b"".join(d.to_bytes(8, "big") for d in self.digests),))]

    def _answer_digest(self, src: str, theirs: bytes) -> list[Action]:
        out: list[Action] = []
        for b in range(BUCKETS):
            if theirs[8 * b:8 * b + 8] != self.digests[b].to_bytes(8, "big"):
                fields: list[Any] = [b]
                for key in self.bucket_keys[b]:
                    counter, index, live = self.versions[key]
                    fields += [key, b"%d.%d.%d" % (counter, index, live)]
                out.append(Send(src, b"AEKEYS", tuple(fields)))
                if len(out) >= MAX_BUCKETS_PER_ROUND:
                    break
        return out

    def _reconcile(self, src: str, bucket: int, fields: Sequence[Any]) -> list[Action]:
        if not 0 <= bucket < BUCKETS:
            return []
        theirs: dict[bytes, tuple[int, int]] = {}
        for i in range(0, len(fields) - 1, 2):
            counter, index, _ = fields[i + 1].split(b".")
            theirs[fields[i]] = (int(counter), int(index))
        out: list[Action] = []
        pull = []
        for key in self.bucket_keys[bucket] | set(theirs):
            mine = self.versions.get(key)
            other = theirs.get(key)
            if mine is not None and (other is None or mine[:2] > other):
                out.append(SendStored(src, b"AEPUT", key))
            elif other is not None and (mine is None or other > mine[:2]):
                pull.append(key)
        if pull:
            out.append(Send(src, b"AEPULL", tuple(pull)))
        return out

    def on_apply_failed(self, req: Any) -> list[Action]:
        """A write failed here (answered with the error when it was a client's; then nothing was sent).
        The version table must say what the datalet holds, not what failed to land, or anti-entropy
        would count this replica as holding it: a local datalet's key is read back, a remote one's
        forgotten (anti-entropy then brings the newest version from the other replicas)."""
        key = req.key if type(req) is StreamFailure else None
        if key is None:
            return []
        old = self.versions.pop(key, None)
        if old is not None:
            bucket = hash64(key) % BUCKETS
            self.digests[bucket] ^= _entry_hash(key, old)
            self.bucket_keys[bucket].discard(key)
        raw = self.read_local(key) if self.read_local is not None else None
        if raw is not None:
            self.on_load(key, raw)
        return []

    def state(self) -> dict[str, Any]:
        return {**super().state(), "role": "replica", "counter": self.counter,
                "versions": len(self.versions), "stale_dropped": self.stale_dropped,
                "repaired": self.repaired, "catching_up": int(not self.ready), "aligned": self.align,
                "alignments": self.alignments}


def _entry_hash(key: bytes, version: tuple[int, int, bool]) -> int:
    return hash64(b"%b\x00%d.%d.%d" % (key, *version))
