"""A parameter's NVMe blocks: one block per chunk (chunks.py), written and read as one tensor.

A tensor of one chunk is block `p<idx>`; a larger one is blocks `p<idx>c<j>`, each holding the bytes of
elements [lo, hi) of chunk j, so a read of a large tensor is several block reads in flight at once on the
file tier's thread pool (several I/O queues), a partial update (the clipping sweep writes one chunk's new
compute copy at a time) rewrites only its chunks, and a chunk starts 4096-aligned in any slot (O_DIRECT
straight into it). Every read of a block first waits for a write of that block still in flight, so a read
never sees a stale or half-written block; a write waits for the previous write of its block (two writes
on the pool could finish out of order).
"""
from __future__ import annotations

from typing import Any

import torch

from mlsyskit.tools.offload.chunks import chunk_ranges
from mlsyskit.tools.offload.filetier import FileTier
from mlsyskit.tools.offload.stealing import Task


class AllDone:
    """Several futures (one tensor's chunk I/O) as one: done when all are, `result` re-raises the first error."""

    def __init__(self, futures: list[Any]) -> None:
        self.futures = futures

    def done(self) -> bool:
        return all(f.done() for f in self.futures)

    def result(self, timeout: float | None = None) -> None:
        for f in self.futures:
            f.result(timeout)

    def consume(self) -> None:  # a read straight into an emulated device slot: compute waits for it on the host
        self.result()


class BlockIO:
    """The NVMe blocks of every entry (`idx`, `key`, `nbytes`, `shape`), by chunk."""

    def __init__(self, nvme: FileTier, entries: list[Any], *, chunk: int | None = None) -> None:
        self.nvme = nvme
        self._blocks: dict[int, list[tuple[str, int, int]]] = {}
        for e in entries:
            numel = e.shape.numel()
            size = e.nbytes // numel if numel else 1
            ranges = chunk_ranges(numel, chunk)
            self._blocks[e.idx] = ([(e.key, 0, e.nbytes)] if len(ranges) == 1 else
                                   [(f"{e.key}c{j}", lo * size, hi * size) for j, (lo, hi) in enumerate(ranges)])
        self._writes: dict[str, Task] = {}  # block key -> its latest write still (maybe) in flight

    def blocks(self, e: Any, lo: int = 0, hi: int | None = None) -> list[tuple[str, int, int]]:
        """(key, first byte, end byte) of e's blocks covering bytes [lo, hi) exactly (chunk-aligned)."""
        hi = e.nbytes if hi is None else hi
        out = [b for b in self._blocks[e.idx] if b[1] >= lo and b[2] <= hi]
        if sum(b[2] - b[1] for b in out) != hi - lo:
            raise ValueError(f"bytes [{lo}, {hi}) of {e.name} are not whole chunks")
        return out

    def await_writes(self, e: Any) -> None:
        for key, _, _ in self._blocks[e.idx]:
            fut = self._writes.pop(key, None)
            if fut is not None:
                fut.result()

    # -- write ----------------------------------------------------------------------------------------
    def write(self, e: Any, buf: torch.Tensor, *, sync: bool = True, lo: int = 0, hi: int | None = None) -> Any:
        """Write e's bytes [lo, hi) (default: all) from `buf` (uint8; byte 0 of buf is byte `lo` of e): at once
        when `sync` (returns None), else on the file tier's pool, one write per block (returns their future)."""
        futures = []
        for key, blo, bhi in self.blocks(e, lo, hi):
            prior = self._writes.pop(key, None)
            if prior is not None:
                prior.result()
            part = buf[blo - lo:]
            if sync:
                self.nvme.write(key, part, bhi - blo)
            else:
                fut = self._writes[key] = self.nvme.submit_write(key, part, bhi - blo)
                futures.append(fut)
        return None if sync else AllDone(futures)

    # -- read -----------------------------------------------------------------------------------------
    def read(self, e: Any, buf: torch.Tensor, *, sync: bool = True) -> Any:
        """Read all of e into `buf` (uint8), each block after any write of it still in flight: at once when
        `sync`, else asynchronously (returns the future of all blocks)."""
        futures = [self._read_block(key, buf[blo:]) for key, blo, _ in self._blocks[e.idx]]
        if sync:
            AllDone(futures).result()
            return None
        return AllDone(futures)

    def _read_block(self, key: str, buf: torch.Tensor) -> Task:
        writing = self._writes.get(key)
        if writing is None or writing.done():
            self._writes.pop(key, None)
            return self.nvme.submit_read(key, buf)
        # the write's storage error is the read's too (raised by writing.result() inside the read)
        return self.nvme.submit_read_after(writing, key, buf)
