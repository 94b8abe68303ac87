"""The plain in-memory reference: every tensor resident, with the offload engine's exact arithmetic.

Same interface as the engine (`begin_step()`, then forward and `backward(loss)` `accumulate` times), so
a test runs one loop against both and compares losses bit for bit: fp32 master weights, gradients
summed in fp32 over the backward passes (copy, then add), the global norm from per-tensor dot products
summed exactly (math.fsum), `optimizer.adam_update` per tensor, compute copies rewritten from the masters.
The same use tracker is installed (with a host that moves nothing): its module hooks insert identity
nodes into the autograd graph, which change the order in which bf16 gradients of branches are summed,
so the reference must have them too to be bit-identical.
"""
from __future__ import annotations

import math
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from mlsyskit.tools.offload.api import to_compute_dtype
from mlsyskit.tools.offload.optimizer import HyperParams, NonFiniteError, adam_update
from mlsyskit.tools.offload.profiler import named_tensors
from mlsyskit.tools.offload.tracking import UseTracker


class PlainAdamW:
    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer | None, *, dtype: torch.dtype,
                 accumulate: int = 1, clip_norm: float | None = None, device: torch.device | None = None) -> None:
        named = named_tensors(model)
        self.params = [(i, p) for i, (_, p) in enumerate(named) if p.requires_grad]
        self.hyper = HyperParams.from_optimizer(optimizer, {id(p): i for i, p in self.params})
        masters, _ = to_compute_dtype(model, dtype, device)
        self.masters = {i: masters[named[i][0]].reshape(-1) for i, _ in self.params}
        self.m = {i: torch.zeros_like(t) for i, t in self.masters.items()}
        self.v = {i: torch.zeros_like(t) for i, t in self.masters.items()}
        self.g = {i: torch.zeros_like(t) for i, t in self.masters.items()}
        self.steps = dict.fromkeys(self.masters, 0)
        self.accumulate, self.clip_norm = accumulate, clip_norm
        self.micro = 0
        self.got: set[int] = set()
        self.tracker = resident_tracker(model)

    def close(self) -> None:
        self.tracker.remove()

    def begin_step(self) -> None:
        self.configs = self.hyper.snapshot()
        self.micro = 0
        self.got.clear()

    def backward(self, loss: torch.Tensor) -> None:
        value = float(loss.detach())
        if not math.isfinite(value):
            raise NonFiniteError(f"the loss is {value}")
        self.tracker.end_forward()
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Full backward hook is firing")
            loss.backward()
        self.tracker.end_backward()
        for i, p in self.params:
            if p.grad is None:
                continue
            grad = p.grad.reshape(-1).to("cpu")
            if i in self.got:
                self.g[i].add_(grad)
            else:
                self.g[i].copy_(grad)
                self.got.add(i)
            p.grad = None
        self.micro += 1
        if self.micro == self.accumulate:
            self._step()
            self.hyper.step_done()

    def _step(self) -> None:
        sumsq = {i: float(torch.dot(self.g[i], self.g[i])) for i in self.got}
        coef = 1.0
        if self.clip_norm is not None:
            norm = math.sqrt(math.fsum(sumsq.values()))
            coef = min(1.0, self.clip_norm / (norm + 1e-6))
        for i, p in self.params:
            if i not in self.got:
                continue
            if coef != 1.0:
                self.g[i].mul_(coef)
            self.steps[i] += 1
            adam_update(self.masters[i], self.g[i], self.m[i], self.v[i], self.steps[i], self.configs[i])
            p.data.view(-1).copy_(self.masters[i])


class _Resident:
    def __init__(self, idx: int, name: str, param: nn.Parameter) -> None:
        self.idx, self.name, self.param, self.trainable = idx, name, param, param.requires_grad


class _NoMoves:
    """Tracker host for a model whose tensors are all resident."""

    def acquire(self, label: str, phase: str, entries: list) -> None:
        pass

    def release(self, entries: list) -> None:
        pass

    def grad_ready(self, entry: object) -> None:
        pass

    def updated(self, entry: object) -> bool:
        return False


def resident_tracker(model: nn.Module) -> UseTracker:
    """The engine's use tracker on a model whose tensors all stay resident (same autograd graph)."""
    return UseTracker(model, [_Resident(i, n, p) for i, (n, p) in enumerate(named_tensors(model))], _NoMoves())


@contextmanager
def plain(model: nn.Module, optimizer: torch.optim.Optimizer | None, *, dtype: torch.dtype = torch.bfloat16,
          accumulate: int = 1, clip_norm: float | None = None) -> Iterator[PlainAdamW]:
    ref = PlainAdamW(model, optimizer, dtype=dtype, accumulate=accumulate, clip_norm=clip_norm)
    try:
        yield ref
    finally:
        ref.close()
