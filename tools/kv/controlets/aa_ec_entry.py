"""Entering aa-ec from a numbered stream: a live switch from ms-sc, ms-ec or aa-sc.

Bytes stored without a version read as version (0, 0) under aa-ec (values.unwrap_versioned), so
no key is rewritten at the switch. That is sound only if every replica holds the same unversioned
state: two different values with the same version (0, 0) are never repaired by anti-entropy.
Under the old protocol the replicas may stand at different positions of the shard's one numbered
stream (writes in flight at the switch, an ms-ec slave behind its master), so a replica that
enters serves nothing until it is *aligned* with a reference state:

- replicas[0] (the old head, master or sequencer, which no replica is ahead of) is aligned at once
  at its position when its old controlet was caught up;
- every other replica asks replicas[0] (ALQ token position force checksum). An aligned replica
  answers ALOK when the positions and the stream checksums (streamlog.py) are equal, known ones:
  equal numbers alone are not equal states after an ms-ec promotion renumbered; otherwise it
  streams its state (the runtime's Snapshot: SNAPBEGIN, SNAPDATA, SNAPEND), which the asker merges
  by version on an emptied datalet. A replica not aligned yet answers ALBUSY; the asker retries
  every sync_timeout;
- a replicas[0] with no valid position (it was catching up at the switch, or it became replicas[0]
  by a failover during alignment) polls the others (ALPOLL -> ALPOS aligned position checksum) and copies
  from an aligned replica if one answered, else from the most advanced position ahead of its own
  (ALQ with force: an unaligned replica then sends the state it holds), and is then aligned. It
  decides only once every replica in the map has answered: a silent one may be the only holder of
  the reference state. A dead replica leaves the map by failover; a replica cut off from it only
  (the coordinator still sees it) holds the shard's entry until the partition heals.

While entering, writes propagated by aligned replicas (LWW, anti-entropy) are merged as usual:
they carry real versions, which an emptied datalet and a snapshot merged by version keep.
The version table of the unversioned keys is rebuilt from the datalet by the runtime
(`loading`: on_load per stored pair, then on_loaded) before the replica serves.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mlsyskit.tools.kv.controlets.base import NOT_SERVING, TRYAGAIN, Action, Reset, Send, Snapshot
from mlsyskit.tools.kv.controlets.streamparts import ValueParts

ENTRY_KINDS = (b"ALQ", b"ALOK", b"ALBUSY", b"ALPOLL", b"ALPOS", b"SNAPBEGIN", b"SNAPDATA", b"SNAPEND",
               b"SNAPPART")
ALIGNED, ASKING, POLLING, RECEIVING = "aligned", "asking", "polling", "receiving"
ALIGNING = f"{TRYAGAIN} replica is aligning with its shard after a switch to aa-ec; retry"  # outcome unknown
REFUSED_ALIGNING = f"{NOT_SERVING} replica is aligning with its shard after a switch to aa-ec; retry"


class Entering:
    """Alignment state of an aa-ec replica, mixed into LastWriterWins, whose merge_pair (merge stored
    bytes by version) and reset_table (forget every version) it uses for a snapshot."""

    def init_entry(self) -> None:
        self.align = ALIGNED
        self.position = -1  # the old stream's position this replica's unversioned state stands at
        self.chain = -1  # the old stream's checksum there (streamlog.py; -1: unknown): equal numbers on two
        # histories (an ms-ec replica promoted behind another) are not equal states
        self.loading = False  # the runtime is rebuilding the version table from the datalet
        self.load_generation = 0  # bumped by a Reset: a scan of the emptied datalet stops
        self.align_token = self.incarnation << 32
        self.align_target: str | None = None
        self.align_deadline = 0.0
        self.polled: dict[str, tuple[bool, int, int]] = {}
        self.alignments = 0  # snapshots received to align
        self.parts = ValueParts()  # a large value of the snapshot being received, in parts

    @property
    def ready(self) -> bool:
        return self.align is ALIGNED and not self.loading

    def enter_from_stream(self, old: Any) -> list[Action]:
        """take_over from a numbered stream: unversioned data, possibly behind replicas[0]."""
        out = old.fail_pending(ALIGNING)
        self.loading = True
        self.position = old.applied if old.ready else -1
        known = old.history.position(old.applied) if self.position >= 0 else ()
        self.chain = known[1] if known else -1
        if self.index == 0 and self.position >= 0 and old.upstream is None:
            self.align = ALIGNED
            return out
        return out + self.start_aligning()

    def carry_entry(self, old: Any) -> list[Action]:
        """take_over from aa-ec (or a replica still holding aa-ec state): keep its alignment."""
        self.position, self.chain, self.loading = old.position, old.chain, old.loading
        self.load_generation, self.alignments = old.load_generation, old.alignments
        if old.align is ALIGNED:
            return []
        self.align = ASKING  # not aligned: replicas[0] under this map polls afresh, the others ask it
        return self.start_aligning()

    def start_aligning(self) -> list[Action]:
        self.align_deadline = self.now + self.options.sync_timeout
        if not self.others:
            self.align = ALIGNED
            return []
        if self.index == 0:
            if self.align is not POLLING:
                self.align, self.polled = POLLING, {}
                self.align_token += 1
            return [Send(n, b"ALPOLL", (self.align_token,)) for n in self.others if n not in self.polled]
        self.align_token += 1
        self.align, self.align_target = ASKING, self.replicas[0]
        return [Send(self.align_target, b"ALQ", (self.align_token, self.position, 0, self.chain))]

    def on_loaded(self) -> list[Action]:
        self.loading = False
        return []

    def tick_entry(self, now: float) -> list[Action]:
        if self.align is ALIGNED or now <= self.align_deadline:
            return []
        # replicas[0] polls again until every replica in the map has answered: a silent one may be the
        # only holder of the reference state (deciding without it would leave two states at version
        # (0, 0) for ever); a dead one leaves the map by failover, and the new map restarts the poll
        return self.start_aligning()

    def on_entry_message(self, src: str, kind: bytes, fields: Sequence[Any]) -> list[Action]:
        token = int(fields[0])
        if kind == b"ALQ":
            return self._answer_alq(src, token, (int(fields[1]), int(fields[3])), fields[2] in (1, b"1"))
        if kind == b"ALPOLL":
            return [Send(src, b"ALPOS", (token, int(self.align is ALIGNED), self.position, self.chain))]
        if token != self.align_token:
            return []  # an abandoned attempt
        if kind == b"ALPOS":
            if self.align is POLLING and src in self.others:
                self.polled[src] = (fields[1] in (1, b"1"), int(fields[2]), int(fields[3]))
                if len(self.polled) == len(self.others):
                    return self._decide()
            return []
        if src != self.align_target:
            return []
        if kind == b"ALBUSY":
            return []  # retried at the deadline
        if kind == b"ALOK" and self.align is ASKING:
            self.align = ALIGNED
            return []
        if kind == b"SNAPBEGIN" and self.align is ASKING:
            self.align, self.align_deadline = RECEIVING, self.now + 10 * self.options.sync_timeout
            self.reset_table()
            self.parts.clear()
            self.loading, self.load_generation = False, self.load_generation + 1
            return [Reset()]
        if kind == b"SNAPPART" and self.align is RECEIVING:
            self.align_deadline = self.now + 10 * self.options.sync_timeout
            self.parts.add(fields)
            return []
        if kind == b"SNAPDATA" and self.align is RECEIVING:
            self.align_deadline = self.now + 10 * self.options.sync_timeout
            out: list[Action] = []
            for key, value in self.parts.pairs(fields):
                out.extend(self.merge_pair(key, value))
            return out
        if kind == b"SNAPEND" and self.align is RECEIVING:
            self.align, self.position, self.chain = ALIGNED, int(fields[1]), -1  # the source's checksum is not sent
            self.alignments += 1
        return []

    def _answer_alq(self, src: str, token: int, theirs: tuple[int, int], force: bool) -> list[Action]:
        if src not in self.others:
            return []
        if self.align is ALIGNED:
            if self._same_state(theirs):
                return [Send(src, b"ALOK", (token,))]
            return [Snapshot(src, token, self.position)]
        if force and self.position >= 0 and self.align is not RECEIVING:
            return [Snapshot(src, token, self.position)]
        return [Send(src, b"ALBUSY", (token,))]

    def _decide(self) -> list[Action]:
        """replicas[0] heard the others: align from an aligned one, else from the most advanced."""
        aligned = [n for n in self.others if self.polled.get(n, (False, -1, -1))[0]]
        if aligned:
            source, force = aligned[0], 0
            if self._same_state(self.polled[source][1:]):
                self.align = ALIGNED
                return []
        else:
            ahead = [n for n in self.others if self.polled.get(n, (False, -1, -1))[1] > self.position]
            if not ahead:
                self.align = ALIGNED  # no replica holds a later state than this one
                self.position = max(self.position, 0)
                return []
            source, force = max(ahead, key=lambda n: (self.polled[n][1], -self.replicas.index(n))), 1
        self.align, self.align_target = ASKING, source
        self.align_deadline = self.now + self.options.sync_timeout
        return [Send(source, b"ALQ", (self.align_token, self.position, force, self.chain))]

    def _same_state(self, theirs: tuple[int, int]) -> bool:
        """Equal positions with equal, known checksums: the same unversioned state."""
        position, chain = theirs
        return position >= 0 and position == self.position and chain != -1 and chain == self.chain

