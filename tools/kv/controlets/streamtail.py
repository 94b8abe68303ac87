"""Catch-up by log tail, both sides (the half of controlets/stream.py's OrderedStream that serves
and receives a tail): a ready replica asked SYNCREQ token seq chain answers with the messages after
the requester's position when its own history passed through that position and still holds them
(streamlog.py), else with a whole snapshot; the requester applies a tail through its normal apply
path and checks that it led to the source's position and checksum, else copies the whole state.

The replica modes of a numbered stream are defined here, below stream.py.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mlsyskit.tools.kv.controlets.base import Action, Send, Snapshot
from mlsyskit.tools.kv.controlets.streamlog import fields_size

READY, WAITING, RECEIVING, CONFIRMING, POLLING = "ready", "waiting", "receiving", "confirming", "polling"
TAILING = "tailing"  # receiving the log tail after our position


class LogTail:
    """Mixed into OrderedStream (which supplies the state and begin_sync/apply_stream/on_synced)."""

    applied: int
    mode: str
    gaps: int
    history: Any
    copy: dict[str, Any]
    tail_entries: int
    tail_bytes: int

    def answer_sync(self, src: str, fields: Sequence[Any]) -> list[Action]:
        """SYNCREQ token [seq chain] at a ready replica: the log tail after the requester's position
        when this history passed through it and still holds the messages, else the whole snapshot
        (preceded by the checksum at its position, so the requester can take tails later)."""
        token, h = int(fields[0]), self.history
        known = h.chain is not None and h.seq == self.applied
        if len(fields) >= 3 and known:
            seq = int(fields[1])
            tail = h.tail_after(seq, int(fields[2]))
            if tail is not None:
                self.copy["tails_served"] += 1
                return [Send(src, b"LOGBEGIN", (token, seq)), *(Send(src, b"LOGDATA", (token, *f)) for f in tail),
                        Send(src, b"LOGEND", (token, self.applied, h.chain))]
        self.copy["snapshots_served"] += 1
        snapshot = Snapshot(src, token, self.applied)
        return [Send(src, b"SNAPCHAIN", (token, self.applied, h.chain)), snapshot] if known else [snapshot]

    def _on_tail(self, src: str, kind: bytes, fields: Sequence[Any]) -> list[Action]:
        """LOGBEGIN token seq / LOGDATA token message... / LOGEND token seq chain from our source
        (token and sender already checked): each message goes through the normal apply path."""
        if kind == b"LOGBEGIN":
            if self.mode is WAITING and int(fields[1]) == self.applied:
                self.mode, self.tail_entries, self.tail_bytes = TAILING, 0, 0
            return []
        if self.mode is not TAILING:
            return []
        if kind == b"LOGDATA":
            message = tuple(fields[1:])
            seq = int(message[0])
            if seq != self.applied + 1:
                self.gaps += 1
                return self.begin_sync()
            self.applied = seq
            self.history.record(seq, message)
            self.tail_entries += 1
            self.tail_bytes += fields_size(message)
            return self.apply_stream(src, seq, message)
        if kind != b"LOGEND":
            return []
        if int(fields[1]) != self.applied or int(fields[2]) != self.history.chain:
            self.gaps += 1  # the tail did not lead to the source's state: copy the whole of it
            self.history.forget(self.applied)
            return self.begin_sync()
        self.mode = READY
        self.copy["tails"] += 1
        self.copy["copied_bytes"] += self.tail_bytes
        return self.on_synced()
