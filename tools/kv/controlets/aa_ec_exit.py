"""Leaving aa-ec for a numbered stream: a live switch to ms-sc, ms-ec or aa-sc.

Under aa-ec every replica may hold acknowledged writes the others lack (propagation is
asynchronous), and its datalet holds versioned records. A numbered stream needs one state at
its origin that every other replica copies. So the new origin (replicas[0]: head, master or
sequencer) first *gathers*: it asks every other replica for its (key, version) table and pulls
whatever is newer than its own, merged by version exactly as aa-ec merges:

    origin                                  other replica (still holding its aa-ec state)
    GATHER token              ->
                              <-  GKEYS token bucket key version ...   (one per non-empty bucket)
                              <-  GEND token
    GPULL token key ...       ->                                       (what the origin lacks)
    GFIN token                ->
                              <-  GPUT key stored-bytes ...            (SendStored, FIFO)
                              <-  GDONE token
    GREADY token              ->                                       (the origin serves: copy it)

When every other replica has said GDONE the origin deletes the tombstones it holds, starts a
new numbering at 0 and serves; live versioned records stay as they are (redis/values.py reads them
under every controlet). The other replicas refuse clients and do not empty their datalets until
they copy the origin's state by the ordinary catch-up (stream.py: SYNCREQ, answered SYNCBUSY by
every replica not serving yet; a replica leaving aa-ec then waits for the origin's GREADY or its
next retry instead of asking again at once), so nothing is emptied before the origin has gathered it. An
other replica that does not answer is asked again every 4 x sync_timeout; a failed one is
failed over (a new map), and the gathering starts again under it. Writes acknowledged under
aa-ec by a replica that fails before the origin gathers them are lost, as they are in aa-ec's
own failover (asynchronous propagation).
"""
from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any

from mlsyskit.tools.kv.controlets.base import RECONFIGURED, Action, Apply, Send, SendStored

GATHER_KINDS = (b"GATHER", b"GKEYS", b"GEND", b"GPULL", b"GFIN", b"GPUT", b"GDONE", b"GREADY")
GATHERING = "gathering"


class LeavingVersions:
    """Mixed into OrderedStream: the aa-ec state this replica still holds, and the gathering."""

    lww: Any = None  # the aa-ec controlet whose state this replica's datalet still holds
    gather_pending: frozenset[str] = frozenset()
    gathered_keys = 0  # versions the origin pulled while gathering

    def leave_versions(self, old: Any) -> list[Action]:
        lww = old if getattr(old, "versioned", False) else old.lww
        out = old.fail_pending(RECONFIGURED)
        self.lww, self.applied = lww, 0  # a new numbering starts once the origin has gathered
        if self.index == 0:
            return out + self._gather()
        return out + self.begin_sync()

    def _gather(self) -> list[Action]:
        self.mode, self.token = GATHERING, self.token + 1
        self.gather_pending = frozenset(self.others)
        self.sync_deadline = self.now + 4 * self.options.sync_timeout
        if not self.others:
            return self._gathered()
        return [Send(n, b"GATHER", (self.token,)) for n in self.others]

    def tick_gather(self, now: float) -> list[Action]:
        if now <= self.sync_deadline:
            return []
        self.sync_deadline = now + 4 * self.options.sync_timeout
        return [Send(n, b"GATHER", (self.token,)) for n in sorted(self.gather_pending)]

    def on_gather_message(self, src: str, kind: bytes, fields: Sequence[Any]) -> list[Action]:
        if src not in self.others:
            return []
        if kind == b"GPUT":  # fields: key, stored bytes (SendStored carries no token)
            if self.mode is GATHERING and src in self.gather_pending:
                self.gathered_keys += 1
                return self.lww.merge_pair(fields[0], fields[1])
            return []
        token = fields[0]
        if kind == b"GATHER":  # at another replica: tell the origin every version held here
            return self._versions_for(src, token)
        if kind == b"GPULL":
            held = self.lww.versions if self.lww is not None else {}
            return [SendStored(src, b"GPUT", k) for k in fields[1:] if k in held]
        if kind == b"GFIN":
            return [Send(src, b"GDONE", (token,))]
        if kind == b"GREADY":  # the origin serves: copy it now rather than at the next retry
            if self.lww is not None and src == self.replicas[0] and self.mode is not self.READY_MODE:
                self.prefer = src
                return self.begin_sync()
            return []
        if self.mode is not GATHERING or int(token) != self.token or src not in self.gather_pending:
            return []
        if kind == b"GKEYS":
            return self._pull(src, fields[2:])
        if kind == b"GEND":
            return [Send(src, b"GFIN", (token,))]
        if kind == b"GDONE":
            self.gather_pending -= {src}
            if not self.gather_pending:
                return self._gathered()
        return []

    def _versions_for(self, origin: str, token: Any) -> list[Action]:
        out: list[Action] = []
        lww = self.lww
        if lww is not None:
            for bucket, keys in enumerate(lww.bucket_keys):
                if keys:
                    flat: list[Any] = [token, bucket]
                    for key in keys:
                        counter, index, live = lww.versions[key]
                        flat += [key, b"%d.%d.%d" % (counter, index, live)]
                    out.append(Send(origin, b"GKEYS", tuple(flat)))
        out.append(Send(origin, b"GEND", (token,)))
        return out

    def _pull(self, src: str, pairs: Sequence[Any]) -> list[Action]:
        mine = self.lww.versions
        pull = []
        for i in range(0, len(pairs) - 1, 2):
            counter, index, _ = pairs[i + 1].split(b".")
            held = mine.get(pairs[i])
            if held is None or (int(counter), int(index)) > held[:2]:
                pull.append(pairs[i])
        return [Send(src, b"GPULL", (self.token, *pull))] if pull else []

    def _gathered(self) -> list[Action]:
        """Every other replica's newer writes are here: drop the tombstones and serve."""
        out: list[Action] = [Apply(k, None) for k, (_, _, live) in self.lww.versions.items() if not live]
        self.lww, self.mode, self.gather_pending = None, self.READY_MODE, frozenset()
        # a new numbering, and a history of its own, so later catch-ups can take log tails from it
        self.history.restart(0, zlib.crc32(b"%s/%d/%d" % (self.node_id.encode(), self.epoch, self.token)))
        return out + self.on_synced() + [Send(n, b"GREADY", (self.token,)) for n in self.others]
