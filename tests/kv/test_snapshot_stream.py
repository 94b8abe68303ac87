"""The snapshot stream (snapshot.py): it yields between chunks, so a large copy does not block the
source's heartbeats, a source that empties its datalet meanwhile never completes the export, and
every message stays within a chunk of bytes, a value larger than a chunk going in parts that the
receiver joins (streamparts.py)."""
from __future__ import annotations

import asyncio

import pytest

from mlsyskit.tools.kv.controlets.base import Snapshot
from mlsyskit.tools.kv.controlets.streamparts import ValueParts
from mlsyskit.tools.kv.datalets.memory import MemoryDatalet
from mlsyskit.tools.kv.node.snapshot import stream_snapshot

CHUNK = 4096  # bytes per message in these tests (the default is 1 MiB)


class _Source:
    """What stream_snapshot uses of its host (the Interpreter): datalet, messages, tasks, reset count."""

    def __init__(self, pairs: int, size: int = 400) -> None:
        self.datalet = MemoryDatalet()
        for i in range(pairs):
            self.datalet.data[b"k%05d" % i] = ((b"v%d." % i) * size)[:size]
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
        stream_snapshot(source, Snapshot("r1", 7, 42), chunk_bytes=CHUNK)
        for i in range(10_000):  # another task of the same loop: a heartbeat
            if not source.tasks:
                break
            ticks.append(len(source.frames))
            meanwhile(source, i)
            await asyncio.sleep(0)
    asyncio.run(main())
    return ticks


def _received(frames: list[tuple]) -> dict[bytes, bytes]:
    """What a receiver applies: SNAPDATA pairs, a value sent in parts joined (ValueParts)."""
    parts, out = ValueParts(), {}
    for kind, fields in frames:
        if kind == b"SNAPPART":
            parts.add(fields)
        elif kind == b"SNAPDATA":
            out.update(parts.pairs(fields))
    return out


def test_the_export_yields_between_chunks_and_ends_with_snapend() -> None:
    source = _Source(100)
    ticks = _run(source, lambda s, i: None)
    kinds = [f[0] for f in source.frames]
    assert kinds[0] == b"SNAPBEGIN" and kinds[-1] == b"SNAPEND" and kinds.count(b"SNAPDATA") >= 10
    assert _received(source.frames) == source.datalet.data
    assert all(sum(len(x) for x in f[1][1:]) <= CHUNK for f in source.frames if f[0] == b"SNAPDATA")
    assert len(set(ticks)) >= 5  # the other task ran while the export was under way


@pytest.mark.parametrize("big", [CHUNK + 1, 2 * CHUNK, 5 * CHUNK + 17])
def test_a_value_larger_than_a_chunk_streams_in_parts_and_is_joined(big: int) -> None:
    source = _Source(30, size=1500)  # several values per chunk, a chunk boundary mid-run
    source.datalet.data[b"k00015"] = bytes(range(256)) * (big // 256) + b"x" * (big % 256)
    _run(source, lambda s, i: None)
    assert _received(source.frames) == source.datalet.data
    for kind, fields in source.frames[1:-1]:  # every message within a chunk (plus its key)
        assert kind in (b"SNAPDATA", b"SNAPPART")
        assert sum(len(x) for x in fields[1:]) <= CHUNK + len(b"k00015")
    assert [f[0] for f in source.frames].count(b"SNAPPART") == (big - 1) // CHUNK


def test_a_source_that_empties_its_datalet_meanwhile_never_sends_snapend() -> None:
    source = _Source(100)

    def reset_once(s: _Source, i: int) -> None:
        if i == 3:
            s.resets += 1  # Interpreter._issue counts every Reset it executes
            s.datalet.data.clear()
    _run(source, reset_once)
    kinds = [f[0] for f in source.frames]
    assert kinds[0] == b"SNAPBEGIN" and b"SNAPEND" not in kinds and kinds.count(b"SNAPDATA") < 9
