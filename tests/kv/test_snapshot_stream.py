"""The snapshot stream (snapshot.py): it yields between batches, so a large copy does not block the
source's heartbeats, and a source that empties its datalet meanwhile never completes the export."""
from __future__ import annotations

import asyncio

from mlsyskit.tools.kv.controlets.base import Snapshot
from mlsyskit.tools.kv.datalets.memory import MemoryDatalet
from mlsyskit.tools.kv.node.snapshot import SNAPSHOT_BATCH, stream_snapshot


class _Source:
    """What stream_snapshot uses of its host (the Interpreter): datalet, messages, tasks, reset count."""

    def __init__(self, pairs: int) -> None:
        self.datalet = MemoryDatalet()
        for i in range(pairs):
            self.datalet.data[b"k%05d" % i] = b"v%d" % i
        self.frames: list[tuple] = []
        self.tasks: set = set()
        self.resets = 0

    def send_message(self, node: str, kind: bytes, fields: tuple) -> None:
        self.frames.append((kind, fields))

    def spawn(self, work) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)


def _run(source: _Source, meanwhile) -> list[int]:
    ticks: list[int] = []

    async def main() -> None:
        stream_snapshot(source, Snapshot("r1", 7, 42))
        for i in range(10_000):  # another task of the same loop: a heartbeat
            if not source.tasks:
                break
            ticks.append(len(source.frames))
            meanwhile(source, i)
            await asyncio.sleep(0)
    asyncio.run(main())
    return ticks


def test_the_export_yields_between_batches_and_ends_with_snapend() -> None:
    source = _Source(10 * SNAPSHOT_BATCH)
    ticks = _run(source, lambda s, i: None)
    kinds = [f[0] for f in source.frames]
    assert kinds[0] == b"SNAPBEGIN" and kinds[-1] == b"SNAPEND" and kinds.count(b"SNAPDATA") == 10
    sent = [x for f in source.frames if f[0] == b"SNAPDATA" for x in f[1][1:]]
    assert dict(zip(sent[0::2], sent[1::2], strict=True)) == source.datalet.data
    assert len(set(ticks)) >= 5  # the other task ran while the export was under way


def test_a_source_that_empties_its_datalet_meanwhile_never_sends_snapend() -> None:
    source = _Source(10 * SNAPSHOT_BATCH)

    def reset_once(s: _Source, i: int) -> None:
        if i == 3:
            s.resets += 1  # Interpreter._issue counts every Reset it executes
            s.datalet.data.clear()
    _run(source, reset_once)
    kinds = [f[0] for f in source.frames]
    assert kinds[0] == b"SNAPBEGIN" and b"SNAPEND" not in kinds and kinds.count(b"SNAPDATA") < 10
