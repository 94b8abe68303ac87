"""Library API: wrap your own nn.Module so its parameters and optimizer state live across the tiers.

    import torch
    from mlsyskit.tools.offload import Budgets, offload, profile

    model = MyModel()                                   # any nn.Module, unchanged
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)   # its param groups are read at every step
    sched = torch.optim.lr_scheduler.StepLR(opt, 10)    # optional: group lr changes are honoured
    prof = profile(model, lambda m: m(x, y), name="my-model")   # warm-up step in bf16, recording uses
    budgets = Budgets(device=2 << 30, cpu=4 << 30, optimizer=16 << 30, nvme_dir=Path("/nvme/tencache"))
    with offload(model, opt, budgets, prof, accumulate=1, clip_norm=1.0) as engine:
        for x, y in loader:
            engine.begin_step()
            loss = model(x, y)
            engine.backward(loss)                       # backward + CPU AdamW per tensor as gradients arrive
            sched.step()
    # on exit the model holds ordinary parameters again, in their original dtype, from the fp32 masters

Inputs must be on `engine.device` (the CUDA GPU, or the CPU for the emulated device). Call the model
itself (its root module's hooks open the tracked forward); tied weights, frozen parameters, buffers,
functional uses of another module's parameters and modules whose backward saves views of their weights
(torch's nn.Linear, nn.Conv*, nn.MultiheadAttention) are handled (see tracking.py). Adam/AdamW only;
the optimizer's own step() must not be called (the engine updates the parameters).
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import nn

from mlsyskit.tools.offload.engine import Budgets, OffloadEngine, pick_device
from mlsyskit.tools.offload.memory_accounting import pin_mmap_threshold, release_freed_heap
from mlsyskit.tools.offload.optimizer import HyperParams
from mlsyskit.tools.offload.profiler import Profile, named_tensors, profile_model


def to_compute_dtype(model: nn.Module, dtype: torch.dtype, device: torch.device | None = None, *,
                     keep_masters: bool = True) -> tuple[dict[str, torch.Tensor], dict[str, torch.dtype]]:
    """Convert parameters (and floating buffers, which their modules read with the parameters) to `dtype`;
    returns the fp32 master weights of trainable parameters and every parameter's original dtype."""
    masters, dtypes = {}, {}
    for name, p in named_tensors(model):
        dtypes[name] = p.dtype
        if p.requires_grad and keep_masters:  # an fp32 parameter's own storage becomes its master (no second copy)
            masters[name] = p.detach() if p.dtype == torch.float32 else p.detach().to(torch.float32)
        if p.is_floating_point():
            p.data = p.data.to(dtype)
    for module in model.modules():
        for bname, b in module._buffers.items():
            if b is not None:
                b = b.to(dtype) if b.is_floating_point() else b
                module._buffers[bname] = b.to(device) if device is not None else b
    return masters, dtypes


def profile(model: nn.Module, step: Callable[[nn.Module], torch.Tensor], *, name: str = "model",
            dtype: torch.dtype = torch.bfloat16, batch: int = 0, seq: int = 0) -> Profile:
    """Record the tensor execution order of one forward+backward of `step(m)` (which returns the loss).
    The model runs in `dtype` for it and gets its own tensors back afterwards (buffers included, so
    BatchNorm statistics are untouched); no full-precision copy of the model is made."""
    originals = [(p, p.data) for _, p in named_tensors(model)]
    buffers = [(m, n, b) for m in model.modules() for n, b in m._buffers.items() if b is not None]
    try:
        for m, n, b in buffers:  # updated in place by the forward (BatchNorm): profile on copies (small)
            m._buffers[n] = b.clone()
        to_compute_dtype(model, dtype, keep_masters=False)
        return profile_model(model, lambda: step(model), model_name=name, batch=batch, seq=seq)
    finally:
        for p, data in originals:
            p.data, p.grad = data, None
        for m, n, b in buffers:
            m._buffers[n] = b


@contextmanager
def offload(model: nn.Module, optimizer: torch.optim.Optimizer | None, budgets: Budgets,
            profile: Profile | None = None, *, policy: str = "tencache", device: torch.device | None = None,
            dtype: torch.dtype = torch.bfloat16, accumulate: int = 1,
            clip_norm: float | None = None) -> Iterator[OffloadEngine]:
    """Place `model`'s parameters and AdamW state across device, CPU and NVMe for the `with` block.
    `accumulate`: backward passes per optimizer step (one more raises); `clip_norm`: global-norm clipping."""
    pin_mmap_threshold()  # freed weights go back to the kernel: host memory stays near the budgets
    device = device or pick_device()
    trainable = {id(p): i for i, (_, p) in enumerate(named_tensors(model)) if p.requires_grad}
    hyper = HyperParams.from_optimizer(optimizer, trainable)
    frozen = {n: p.data for n, p in named_tensors(model) if not p.requires_grad and p.dtype != dtype}
    buffer_dtypes = {(id(m), n): b.dtype for m in model.modules() for n, b in m._buffers.items() if b is not None}
    masters, dtypes = to_compute_dtype(model, dtype, device)
    engine = OffloadEngine(model, masters, policy=policy, budgets=budgets, profile=profile, hyper=hyper,
                           device=device, accumulate=accumulate, clip_norm=clip_norm)
    del masters
    release_freed_heap()  # the model's own storage, now in the tiers
    try:
        yield engine
    finally:
        try:
            engine.materialize(dtypes)
            params = dict(named_tensors(model))
            for n, original in frozen.items():  # never updated: their original values, not a rounded copy
                params[n].data = original
            for module in model.modules():
                for bname, b in module._buffers.items():
                    if b is not None:
                        module._buffers[bname] = b.to("cpu", buffer_dtypes[(id(module), bname)])
        finally:
            engine.close()
