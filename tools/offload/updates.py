"""The engine's gradient path: gradients staged off the autograd thread, summed in fp32, AdamW per tensor.

Each trainable parameter's post-accumulate-grad hook (`grad_ready`, in the autograd thread) stages its
gradient (a pinned device->host copy on a GPU) and hands it to the optimizer worker thread
(grad_pipeline.py), which adds it into the fp32 gradient slot of its optimizer state (`_optimize`); on the
last of `accumulate` backward passes the CPU AdamW step runs there per tensor as its gradient arrives, or,
with `clip_norm`, in a second sweep after the global norm is known (`_clip_and_update`).

`GradientUpdates` is a mixin of `engine.OffloadEngine`: it reads the engine's store, states, stager,
worker, hyper-parameters and counters, and owns no state of its own.
"""
from __future__ import annotations

import functools
import math
import time
from typing import Any

import torch

from mlsyskit.core.errors import UsageError
from mlsyskit.tools.offload.chunk_updates import accumulate_and_step, clip_update
from mlsyskit.tools.offload.optimizer import NonFiniteError
from mlsyskit.tools.offload.tiers import Entry

MISUSED_BACKWARD = ("inside offload(), call engine.backward(loss) instead of loss.backward(): the engine must "
                    "open the backward pass (it makes offloaded parameters resident and runs the CPU optimizer)")


class GradientUpdates:
    """grad_ready -> _optimize on the worker -> (clip sweep) -> AdamW; see the module docstring."""

    store: Any
    states: Any
    stager: Any
    worker: Any
    accumulate: int
    clip_norm: float | None
    adam_step: int
    param_steps: dict[int, int]
    progress: Any
    ranks: Any  # ranks.RankGroup or None
    gatherer: Any  # gather.Gatherer (several ranks) or None

    def grad_ready(self, e: Entry) -> None:
        """In the autograd thread: stage e's gradient and hand it to the optimizer worker (`_optimize`)."""
        if not self._in_backward:
            raise UsageError(MISUSED_BACKWARD)
        t0 = time.perf_counter()
        grad = e.param.grad
        e.param.grad = None
        self.stager.apply()
        last = self._micro == self.accumulate - 1
        update = last and self.clip_norm is None  # else: a sweep after backward
        if self.gatherer is not None:  # several ranks: the fp32 sum of every rank's gradient, at its owner
            grad = self.gatherer.reduce_grad(e, grad)
            if grad is None:  # another rank owns e: it updates e
                if update:
                    self._updated.add(e.idx)
                self.stats.optimizer_s += time.perf_counter() - t0
                return
        first = e.idx not in self._got
        self._got.add(e.idx)
        if update:
            self._updated.add(e.idx)  # now, not when the worker gets to it: backward must not read it again
        buf, copy, slot = self.stager.stage(e.idx, grad)
        del grad
        jobs_s = self._worker_s
        self.worker.submit(functools.partial(self._optimize, e, buf, copy, slot, first, last, update))
        # a job run or waited for inside submit (the queue was full) is counted once, in _worker_s
        self.stats.optimizer_s += max(0.0, time.perf_counter() - t0 - (self._worker_s - jobs_s))

    def _optimize(self, e: Entry, buf: torch.Tensor, copy, slot, first: bool, last: bool, update: bool) -> None:
        """On the worker (or the autograd thread, whichever gets there first): add the staged gradient into
        e's fp32 slot; on the last pass, its squared norm and (without clipping) the AdamW step, the new
        compute copy cast into `buf` for the tier thread."""
        t0 = time.perf_counter()
        done = None
        try:
            if copy is not None:
                copy.result()  # the device->host copy's own event
            if update:
                self.param_steps[e.idx] += 1
            # chunk by chunk (chunk_updates.py): the fp32 gradient sum, its squared norm, AdamW, the new compute copy
            sumsq = accumulate_and_step(self.states, e.idx, buf, first=first, last=last,
                                        step=self.param_steps[e.idx] if update else None,
                                        cfg=self._configs.get(e.idx), what=f"{e.name} at step {self.adam_step + 1}")
            if last:
                self._sumsq[e.idx] = sumsq
            done = buf if update else None
        finally:
            self.stager.hand_back(e, done, slot)  # always: the staging slot must come back
            self._worker_s += time.perf_counter() - t0

    def _join_optimizer(self) -> BaseException | None:
        """Wait for the worker, apply every hand-back; the worker's first error, if any."""
        error = self.worker.join()
        self.stager.apply(wait=True)  # the next forward reads these copies; the slots are free for the next step
        self.stats.optimizer_s += self._worker_s
        self._worker_s = 0.0
        return error

    def _update(self, e: Entry, coef: float) -> None:
        def write(lo: int, master: torch.Tensor, scratch: torch.Tensor) -> None:  # fp32 -> compute copy
            if e.bound:
                self.store.device_view(e).view(-1)[lo:lo + master.numel()].copy_(master)
            else:
                self.store.write_home(e, master, scratch, lo=lo)

        self.param_steps[e.idx] += 1
        clip_update(self.states, e.idx, coef, self.param_steps[e.idx], self._configs[e.idx], write)
        self._updated.add(e.idx)

    def _clip_and_update(self) -> None:
        """Second sweep in optimizer order: scale every gradient by clip/(norm + 1e-6) when the global norm
        exceeds clip (torch.nn.utils.clip_grad_norm_'s rule), then update."""
        t0 = time.perf_counter()
        norm = math.sqrt(math.fsum(self._sumsq.values()))
        if not math.isfinite(norm):
            raise NonFiniteError(f"the gradient norm is {norm} at step {self.adam_step + 1}")
        coef = 1.0 if self.clip_norm is None else min(1.0, self.clip_norm / (norm + 1e-6))
        self.states.begin_step()
        order = self.states.order
        for k, idx in enumerate(order):
            if idx not in self._sumsq:
                continue  # no gradient reached it in this step: not updated, as torch.optim skips it
            if self.progress is not None:
                self.progress.set("step {}: optimizer {:.0%} of tensors", self.adam_step + 1, k / len(order))
            self._update(self.store.entries[idx], coef)
        self.stats.optimizer_s += time.perf_counter() - t0

    def _share_norms(self) -> None:
        """Several ranks: every rank's per-tensor squared gradient norms (each tensor's, from its owner), so
        the global norm (clipping, `grad_norm`) is the single process's exact sum (math.fsum)."""
        merged: dict[int, float] = {}
        for part in self.ranks.gather_objects(self._sumsq, "squared gradient norms"):
            merged.update(part)
        self._sumsq = merged

    @property
    def grad_norm(self) -> float:
        """Global gradient norm of the last completed step (fp32 gradients, summed exactly)."""
        return math.sqrt(math.fsum(self._sumsq.values()))
