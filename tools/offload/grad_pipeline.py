"""Gradients leave the autograd thread at once; CPU AdamW runs on one optimizer worker thread.

The autograd thread owns the tiers during backward (module hooks move tensors), so it does only what is
quick: it stages each finished gradient and submits a job to a bounded queue, then returns to backward.

    autograd thread                                  optimizer worker
    grad ready -> GradStager.stage:                  job: wait for the copy's event (GPU) ->
      GPU: device->host copy on the side stream        add into the fp32 gradient, AdamW on the CPU,
      into a pinned slot of the gradient's size,       cast the new master weight into the staging
      event recorded after the copy (streams.py)       buffer -> hand-back
      host: the gradient itself
    -> OptimizerWorker.submit (when full, runs the
       oldest waiting job itself)
    at the next gradient and at step end (join): apply hand-backs: write the compute copy into its tier,
    release the staging slot

The tiers are only ever touched by the thread that owns them; a job (whichever thread runs it: the worker,
or the tier thread when it would otherwise wait for the worker) touches only the optimizer-state cache and
the staged buffers handed to it. A job's error (a non-finite gradient) stops the jobs after it
and is raised by `submit` and by `join`.
"""
from __future__ import annotations

import queue
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

import torch

from mlsyskit.tools.offload.memory import BufferPool, Slot
from mlsyskit.tools.offload.streams import StreamOps, enqueue_copy


class OptimizerWorker:
    """Submitted jobs run one at a time in submission order, on the worker thread or on the submitting one,
    whoever gets there first: a submit that finds `depth` jobs waiting, and `join`, run the oldest waiting job
    themselves instead of waiting for the worker to be scheduled (on a busy host, tens of ms per wake-up).
    Jobs never overlap (the optimizer-state cache is not thread-safe), and both threads use the same torch
    intra-op thread count, so a job's result does not depend on which thread ran it."""

    def __init__(self, depth: int, *, threads: int | None = None) -> None:
        if depth < 1:
            raise ValueError(f"optimizer queue depth must be >= 1, got {depth}")
        self._depth = depth
        self._jobs: deque[Callable[[], None]] = deque()
        self._queue = threading.Condition()  # guards _jobs and _closing; wakes the worker
        self._running = threading.Lock()  # held while a job is taken and run: jobs never overlap
        self._closing = False
        self._error: BaseException | None = None
        # torch's intra-op thread count is per thread: match the caller's, so reductions sum in the same order
        self._threads = threads if threads is not None else torch.get_num_threads()
        self._thread = threading.Thread(target=self._run, name="tencache-optimizer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        torch.set_num_threads(self._threads)
        while True:
            with self._queue:
                while not self._jobs and not self._closing:
                    self._queue.wait()
                if not self._jobs:
                    return
            self.run_oldest()

    def run_oldest(self) -> bool:
        """Run the oldest waiting job in this thread; False when none waits (then none is running either)."""
        with self._running:
            with self._queue:
                if not self._jobs:
                    return False
                job = self._jobs.popleft()
            if self._error is None:
                try:
                    job()
                except BaseException as exc:  # kept for the owner's next submit/join; later jobs are skipped
                    self._error = exc
            return True

    def submit(self, job: Callable[[], None]) -> None:
        if self._error is not None:
            raise self._error
        while True:
            with self._queue:
                if len(self._jobs) < self._depth:
                    self._jobs.append(job)
                    self._queue.notify()
                    return
            self.run_oldest()  # full: do the oldest job here rather than wait for the worker

    def join(self) -> BaseException | None:
        """Run or wait for every submitted job; return (and clear) the first job's error, if any."""
        while self.run_oldest():
            pass
        error, self._error = self._error, None
        return error

    def close(self) -> None:
        with self._queue:
            self._closing = True
            self._queue.notify()
        if self._thread.is_alive():
            self._thread.join()


class GradStager:
    """Moves a finished gradient to host memory the worker may read, and the worker's result back.

    With `streams` (a GPU), a pinned staging pool holds `depth` slots per gradient size (at most the tensors
    of that size); without, the host gradient itself is the buffer. The worker hands each buffer back
    (`hand_back`, holding the new compute copy after an update); the tier thread applies hand-backs
    (`apply`): `write(entry, values, non_blocking)` stores the values in the tensor's tier and returns an
    event when the write is still reading the slot, which then retires when that event completes."""

    def __init__(self, streams: StreamOps | None, class_counts: dict[int, int], depth: int, *,
                 write: Callable[[Any, torch.Tensor, bool], Any]) -> None:
        self.streams = streams
        self.write = write
        self.pool = (BufferPool({s: min(depth, c) for s, c in class_counts.items()}, name="gradient staging")
                     if streams is not None else None)
        self._back: queue.SimpleQueue = queue.SimpleQueue()  # (entry, values | None, slot | None)
        self._retiring: deque = deque()  # (event, slot, owner): device writes still reading a slot
        self.run_job: Callable[[], bool] | None = None  # the optimizer worker's run_oldest, once it exists

    @property
    def capacity_bytes(self) -> int:
        return self.pool.capacity_bytes if self.pool is not None else 0

    # -- the tier thread ---------------------------------------------------------------------------------
    def stage(self, owner: int, grad: torch.Tensor) -> tuple[torch.Tensor, Any, Slot | None]:
        """(host buffer with the gradient's values, a future-like copy or None, the slot to hand back)."""
        flat = grad.reshape(-1)
        if self.pool is None:
            return flat.contiguous(), None, None
        nbytes = flat.numel() * flat.element_size()
        slot = self.pool.try_acquire(nbytes, owner, exact=True)
        while slot is None:
            self._free_one()
            slot = self.pool.try_acquire(nbytes, owner, exact=True)
        buf = slot.view(flat.dtype, (flat.numel(),))
        return buf, enqueue_copy(self.streams, [buf], [flat]), slot

    def apply(self, *, wait: bool = False) -> None:
        """Write back what the worker finished and release slots whose writes completed (all, with `wait`)."""
        while self._retiring and (wait or self._retiring[0][0].query()):
            self._retire_oldest()
        while True:
            try:
                item = self._back.get_nowait()
            except queue.Empty:
                break
            self._apply(item)
        while wait and self._retiring:
            self._retire_oldest()

    def release(self, slot: Slot | None, owner: int) -> None:
        if slot is not None:
            self.pool.release(slot, owner)

    def _apply(self, item: tuple) -> None:
        entry, values, slot = item
        written = self.write(entry, values, slot is not None) if values is not None else None
        if written is None:
            self.release(slot, entry.idx)
        else:
            self._retiring.append((written, slot, entry.idx))

    def _retire_oldest(self) -> None:
        event, slot, owner = self._retiring.popleft()
        event.synchronize()
        self.release(slot, owner)

    def _free_one(self) -> None:
        """No free slot: one comes from a retiring write, else from the next hand-back (`run_job` runs the
        oldest waiting job in this thread, False when none waits; then the worker is running one)."""
        if self._retiring:
            self._retire_oldest()
            return
        while self._back.empty() and self.run_job is not None and self.run_job():
            pass
        self._apply(self._back.get())

    # -- the worker --------------------------------------------------------------------------------------
    def hand_back(self, entry: Any, values: torch.Tensor | None, slot: Slot | None) -> None:
        self._back.put((entry, values, slot))
