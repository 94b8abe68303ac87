"""Streams and events behind one small interface, so the ordering of copies and compute is testable on a CPU.

A copy between host and device runs on the side stream; the compute stream is the one the model runs on.
Every copy follows the same protocol (`Mover` in tiers.py and the gradient stager use it):

    produced = ops.record(ops.compute)   # the compute work enqueued so far (producers of src, readers of dst)
    ops.wait(ops.side, produced)         # the copy starts after exactly that work, not after later modules
    ops.copy(ops.side, dsts, srcs)       # enqueued, non-blocking
    done = ops.record(ops.side)          # recorded after the copy is enqueued: it completes after the copy
    ...
    ops.wait(ops.compute, done)          # before a module reads dst: waits on this tensor's copy only
    done.synchronize()                   # before the host reads dst or reuses src

`CudaStreams` is the implementation on a GPU. Tests substitute a fake that runs the enqueued work lazily
in a seeded order and records it, so a read that is not ordered after its copy sees stale bytes. `Mover`
gives the tiers one copy call for streams and for the emulated device's copy thread.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch

from mlsyskit.tools.offload.copy_kernels import batched_copy
from mlsyskit.tools.offload.stealing import StealingPool, Task


class Event(Protocol):
    def query(self) -> bool: ...

    def synchronize(self) -> None: ...


class StreamOps(Protocol):
    """`compute`: the stream the model runs on (read at each use: autograd may switch it); `side`: copies."""

    @property
    def compute(self) -> Any: ...

    @property
    def side(self) -> Any: ...

    def record(self, stream: Any) -> Event: ...

    def wait(self, stream: Any, event: Event) -> None: ...

    def copy(self, stream: Any, dsts: Sequence[torch.Tensor], srcs: Sequence[torch.Tensor]) -> None: ...


class CudaStreams:
    """torch.cuda streams and events; `copy` of one same-dtype pair is one cudaMemcpyAsync, of several
    pairs one batched kernel launch (CuPy) or torch's foreach copy."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._side = torch.cuda.Stream(device)

    @property
    def compute(self) -> torch.cuda.Stream:
        return torch.cuda.current_stream(self.device)

    @property
    def side(self) -> torch.cuda.Stream:
        return self._side

    def record(self, stream: torch.cuda.Stream) -> torch.cuda.Event:
        event = torch.cuda.Event()
        event.record(stream)
        return event

    def wait(self, stream: torch.cuda.Stream, event: torch.cuda.Event) -> None:
        stream.wait_event(event)

    def copy(self, stream: torch.cuda.Stream, dsts: Sequence[torch.Tensor], srcs: Sequence[torch.Tensor]) -> None:
        if len(dsts) == 1 and dsts[0].dtype == srcs[0].dtype:
            with torch.cuda.stream(stream):
                dsts[0].copy_(srcs[0], non_blocking=True)
            for t in (dsts[0], srcs[0]):
                if t.is_cuda:  # the caching allocator must not reuse it before the copy has run
                    t.record_stream(stream)
            return
        batched_copy(dsts, srcs, stream=stream)  # records the tensors on `stream` itself


class StreamCopy:
    """A copy enqueued on the side stream, as a future: `done`/`result` for the host, `consume` for compute."""

    def __init__(self, ops: StreamOps, event: Event) -> None:
        self.ops = ops
        self.event = event

    def done(self) -> bool:
        return self.event.query()

    def result(self) -> None:
        self.event.synchronize()

    def consume(self) -> None:
        """Order the compute stream after this copy (no host wait)."""
        self.ops.wait(self.ops.compute, self.event)


def enqueue_copy(ops: StreamOps, dsts: Sequence[torch.Tensor], srcs: Sequence[torch.Tensor]) -> StreamCopy:
    """The copy protocol above: after the compute work so far, on the side stream, with its own event."""
    ops.wait(ops.side, ops.record(ops.compute))
    ops.copy(ops.side, dsts, srcs)
    return StreamCopy(ops, ops.record(ops.side))


class ThreadCopy:
    """A copy done by a thread (the emulated device's copy thread, or a read from NVMe): compute waits for it
    on the host, or does it itself when the thread has not started it (stealing.py)."""

    def __init__(self, future: Task) -> None:
        self.future = future

    def done(self) -> bool:
        return self.future.done()

    def result(self) -> None:
        self.future.result()

    def consume(self) -> None:
        self.future.result()


class Mover:
    """Asynchronous copies between host and device: on the side stream of `streams` (CUDA, or a test's
    fake), else on one copy thread (the emulated device; a copy it has not started when compute needs it
    is done by the waiting thread). Every copy returns a future-like object with `done`, `result` (host
    wait) and `consume` (order compute after it)."""

    def __init__(self, device: torch.device, streams: StreamOps | None = None) -> None:
        if streams is None and device.type == "cuda":
            streams = CudaStreams(device)
        self.streams = streams
        # ordered: copies run in submission order, as on a CUDA stream (the tiers are written against one)
        self._thread = None if streams is not None else StealingPool(1, "tencache-copy", ordered=True)

    def copy(self, dsts: list[torch.Tensor], srcs: list[torch.Tensor]) -> Any:
        if self.streams is not None:
            return enqueue_copy(self.streams, dsts, srcs)
        return ThreadCopy(self._thread.submit(batched_copy, dsts, srcs))

    def close(self) -> None:
        if self._thread is not None:
            self._thread.shutdown(wait=True)


class QueuedCopy:
    """A copy waiting for the next batched launch (`flush` launches every queued copy and sets `copy`).
    Not done while queued; waiting on it (`result`, `consume`) launches the batch first."""

    def __init__(self, flush: Callable[[], None]) -> None:
        self.flush = flush
        self.copy: Any = None

    def _launched(self) -> Any:
        if self.copy is None:
            self.flush()
        return self.copy

    def done(self) -> bool:
        return self.copy is not None and self.copy.done()

    def result(self) -> None:
        self._launched().result()

    def consume(self) -> None:
        self._launched().consume()
