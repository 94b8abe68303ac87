"""Library API: wrap your own nn.Module so its parameters and optimizer state live across the tiers.

    import torch
    from mlsyskit.tools.offload import Budgets, offload, profile

    model = MyModel()                                   # any nn.Module; its parameters become bf16 compute copies
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)   # only its hyperparameters are used
    prof = profile(model, lambda m: m(x, y), name="my-model")   # warm-up step on a bf16 copy, recording hooks
    budgets = Budgets(device=2 << 30, cpu=4 << 30, optimizer=16 << 30, nvme_dir=Path("/nvme/tencache"))
    with offload(model, opt, budgets, prof) as engine:
        for x, y in loader:
            engine.begin_step()
            loss = model(x, y)
            engine.backward(loss)                       # backward + CPU AdamW per tensor as gradients arrive
    # on exit the model holds ordinary bf16 parameters again, from the fp32 master weights

Inputs must be on `engine.device` (the CUDA GPU, or the CPU for the emulated device). Models should use
modules whose backward reads the Parameter itself (nn.LayerNorm, nn.Embedding, and
`mlsyskit.tools.offload.model.Linear`; torch's nn.Linear saves a transposed view instead, which is
not swapped back in: use `model.Linear` or run with policy="on-demand").
"""
from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import nn

from mlsyskit.tools.offload.engine import Budgets, OffloadEngine
from mlsyskit.tools.offload.optimizer import AdamConfig
from mlsyskit.tools.offload.profiler import Profile, profile_model


def _to_compute_dtype(model: nn.Module, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    masters = {}
    for name, p in model.named_parameters():
        masters[name] = p.detach().to(torch.float32).clone()
        p.data = p.data.to(dtype)
    return masters


def profile(model: nn.Module, step: Callable[[nn.Module], torch.Tensor], *, name: str = "model",
            dtype: torch.dtype = torch.bfloat16) -> Profile:
    """Record the tensor execution order of one forward+backward of `step(m)` (which returns the loss),
    run on a `dtype` copy of `model` so the model itself keeps its full-precision weights."""
    replica = copy.deepcopy(model)
    for p in replica.parameters():
        p.data = p.data.to(dtype)
    return profile_model(replica, lambda: step(replica), model_name=name, batch=0, seq=0)


def _adam_from(optimizer: torch.optim.Optimizer | None) -> AdamConfig:
    if optimizer is None:
        return AdamConfig()
    group = optimizer.param_groups[0]
    beta1, beta2 = group.get("betas", (0.9, 0.999))
    return AdamConfig(lr=float(group["lr"]), beta1=beta1, beta2=beta2, eps=group.get("eps", 1e-8),
                      weight_decay=group.get("weight_decay", 0.0))


@contextmanager
def offload(model: nn.Module, optimizer: torch.optim.Optimizer | None, budgets: Budgets,
            profile: Profile | None = None, *, policy: str = "tencache", device: torch.device | None = None,
            dtype: torch.dtype = torch.bfloat16) -> Iterator[OffloadEngine]:
    """Place `model`'s parameters and AdamW state across device, CPU and NVMe for the `with` block."""
    masters = _to_compute_dtype(model, dtype)
    engine = OffloadEngine(model, masters, policy=policy, budgets=budgets, profile=profile,
                           adam=_adam_from(optimizer), device=device)
    del masters
    try:
        yield engine
    finally:
        try:
            engine.materialize()
        finally:
            engine.close()
