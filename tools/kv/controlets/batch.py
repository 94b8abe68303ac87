"""One stream message per pipeline batch (issue 22 item 5): the plain SETs a client pipelined in one
read enter the ordered stream (ms-sc's chain, ms-ec's replication) as ONE numbered entry.

The front end gathers a connection's consecutive plain SETs (no options, values stored as they came)
of one read; the origin (chain head, master) numbers them together, applies them and sends one
message, (seq, BATCH, key1, value1, key2, value2, ...), where each single write would have cost a
message, a frame, a parse, a history entry and an interpreter dispatch at every hop. Everything the
stream guarantees is per entry and so holds per batch: the next number or a catch-up (stream.py),
the log tail and its checksum (streamlog.py: the general path of chain_step), cumulative acks and
write timeouts (each request of the batch waits in the head's in_flight under the batch's number),
undo (every write of the batch keeps its before-image under that number: a datalet error on any
replica takes the whole batch back everywhere and fails all its requests, none of which was
acknowledged). A batch is a connection's writes in its order, and a connection's writes were one
FIFO path already, so session order is unchanged.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mlsyskit.tools.kv.controlets.base import Action, Apply

BATCH = b"B"  # the code field of a batch entry (single writes carry P, D, F or R there)


def batch_fields(seq: int, reqs: Sequence[Any]) -> tuple:
    """The stream entry of a batch of plain SET requests: (seq, BATCH, k1, v1, k2, v2, ...)."""
    flat: list[Any] = [seq, BATCH]
    for r in reqs:
        flat.append(r.key)
        flat.append(r.value)
    return tuple(flat)


def batch_applies(fields: Sequence[Any], seq: int) -> list[Action]:
    """A replica's datalet writes for a batch entry, in the origin's order (seq 0: not undoable)."""
    return [Apply(fields[i], fields[i + 1], None, seq) for i in range(2, len(fields), 2)]
