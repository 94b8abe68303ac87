"""Gradients leave the autograd thread at once; CPU AdamW runs on one optimizer worker thread.

The autograd thread owns the tiers during backward (module hooks move tensors), so it does only what is
quick: it stages each finished gradient and submits a job to a bounded queue, then returns to backward.

    autograd thread                                  optimizer worker
    grad ready -> GradStager.stage:                  job: wait for the copy's event (GPU) ->
      GPU: device->host copy on the side stream        add into the fp32 gradient, AdamW on the CPU,
      into a pinned slot of the gradient's size,       cast the new master weight into the staging
      event recorded after the copy (streams.py)       buffer -> hand-back
      host: the gradient itself
    -> OptimizerWorker.submit (blocks when full)
    at the next gradient and at step end (join): apply hand-backs: write the compute copy into its tier,
    release the staging slot

The tiers are only ever touched by the thread that owns them; the worker touches only the optimizer-state
cache and the staged buffers handed to it. A job's error (a non-finite gradient) stops the jobs after it
and is raised by `submit` and by `join`.
"""
from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

import torch

from mlsyskit.core.memory import BufferPool, Slot
from mlsyskit.tools.offload.streams import StreamOps, enqueue_copy


class OptimizerWorker:
    """One thread running submitted jobs in order; `depth` jobs at most wait in its queue."""

    def __init__(self, depth: int, *, threads: int | None = None) -> None:
        if depth < 1:
            raise ValueError(f"optimizer queue depth must be >= 1, got {depth}")
        self._jobs: queue.Queue[Callable[[], None] | None] = queue.Queue(maxsize=depth)
        self._error: BaseException | None = None
        # torch's intra-op thread count is per thread: match the caller's, so reductions sum in the same order
        self._threads = threads if threads is not None else torch.get_num_threads()
        self._thread = threading.Thread(target=self._run, name="tencache-optimizer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        torch.set_num_threads(self._threads)
        while True:
            job = self._jobs.get()
            try:
                if job is None:
                    return
                if self._error is None:
                    job()
            except BaseException as exc:  # kept for the owner's next submit/join; later jobs are skipped
                self._error = exc
            finally:
                self._jobs.task_done()

    def submit(self, job: Callable[[], None]) -> None:
        if self._error is not None:
            raise self._error
        self._jobs.put(job)

    def join(self) -> BaseException | None:
        """Wait until every submitted job has run; return (and clear) the first job's error, if any."""
        self._jobs.join()
        error, self._error = self._error, None
        return error

    def close(self) -> None:
        if self._thread.is_alive():
            self._jobs.put(None)
            self._thread.join()


class GradStager:
    """Moves a finished gradient to host memory the worker may read. With `streams` (a GPU), a pinned
    staging pool holds `depth` slots per gradient size (at most the tensors of that size); a gradient
    waits for a free slot by applying hand-backs (`wait_free`). Without, the host gradient is used as is."""

    def __init__(self, streams: StreamOps | None, class_counts: dict[int, int], depth: int,
                 wait_free: Callable[[], None]) -> None:
        self.streams = streams
        self.wait_free = wait_free
        self.pool = (BufferPool({s: min(depth, c) for s, c in class_counts.items()}, name="gradient staging")
                     if streams is not None else None)

    @property
    def capacity_bytes(self) -> int:
        return self.pool.capacity_bytes if self.pool is not None else 0

    def stage(self, owner: int, grad: torch.Tensor) -> tuple[torch.Tensor, Any, Slot | None]:
        """(host buffer with the gradient's values, a future-like copy or None, the slot to release)."""
        flat = grad.reshape(-1)
        if self.pool is None:
            return flat.contiguous(), None, None
        nbytes = flat.numel() * flat.element_size()
        slot = self.pool.try_acquire(nbytes, owner, exact=True)
        while slot is None:
            self.wait_free()  # the worker finishes a job, whose hand-back releases a slot
            slot = self.pool.try_acquire(nbytes, owner, exact=True)
        buf = slot.view(flat.dtype, (flat.numel(),))
        return buf, enqueue_copy(self.streams, [buf], [flat]), slot

    def release(self, slot: Slot | None, owner: int) -> None:
        if slot is not None:
            self.pool.release(slot, owner)
