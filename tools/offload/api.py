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

import math
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

import torch
from torch import nn

from mlsyskit.core.errors import UsageError
from mlsyskit.tools.offload.engine import Budgets, OffloadEngine, pick_device
from mlsyskit.tools.offload.lazy import set_data
from mlsyskit.tools.offload.memory_accounting import pin_mmap_threshold, release_freed_heap
from mlsyskit.tools.offload.optimizer import HyperParams
from mlsyskit.tools.offload.profiler import Profile, named_tensors, profile_model
from mlsyskit.tools.offload.progress import ProgressNote
from mlsyskit.tools.offload.ranks import RankGroup


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
    BatchNorm statistics are untouched); no full-precision copy of the model is made. A model on the meta
    device (built lazily) is profiled there: `step` must then give it meta inputs."""
    originals = [(p, p.data) for _, p in named_tensors(model)]
    buffers = [(m, n, b) for m in model.modules() for n, b in m._buffers.items() if b is not None]
    try:
        lazy = any(p.is_meta for p, _ in originals)  # a lazily built model profiles on the meta device
        for m, n, b in buffers:  # updated in place by the forward (BatchNorm): profile on copies (small)
            m._buffers[n] = b.to("meta") if lazy else b.clone()
        to_compute_dtype(model, dtype, keep_masters=False)
        return profile_model(model, lambda: step(model), model_name=name, batch=batch, seq=seq)
    finally:
        for p, data in originals:
            p.data, p.grad = data, None
        for m, n, b in buffers:
            m._buffers[n] = b


def lr_problem(lr: object, beta1: float = 0.9) -> str | None:
    """Why `lr` cannot drive AdamW in fp32 (None when it can): a tensor lr, a non-finite or negative one, a
    positive one below fp32's smallest normal number, or one whose step size lr / (1 - beta1) overflows fp32
    (0 is allowed: a param group that must not change)."""
    if isinstance(lr, torch.Tensor):
        return "a tensor lr is not supported (the engine reads lr as a number at every step); use a float"
    try:
        value = float(lr)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return f"lr must be a number, got {lr!r}"
    fp32 = torch.finfo(torch.float32)
    if not math.isfinite(value) or value < 0:
        return f"lr must be a finite number >= 0, got {lr}"
    if 0 < value < fp32.tiny or value / max(1e-12, 1.0 - beta1) > fp32.max:
        return f"lr {lr} is not representable in fp32 AdamW (step size lr/(1-beta1) must lie in [{fp32.tiny:.3g}, " \
               f"{fp32.max:.3g}])"
    return None


def check_optimizer(model: nn.Module, optimizer: torch.optim.Optimizer | None) -> None:
    """Refuse what the engine cannot honour, before anything changes: no optimizer, a tensor or
    unrepresentable lr, trainable parameters missing from every param group (each one named)."""
    if optimizer is None:
        raise UsageError("offload() needs the torch optimizer (torch.optim.AdamW or Adam) whose param groups "
                         "give each parameter's lr, betas, eps and weight decay; got None")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise UsageError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    for gi, group in enumerate(optimizer.param_groups):
        if (why := lr_problem(group.get("lr"), float(group.get("betas", (0.9, 0.999))[0]))) is not None:
            raise UsageError(f"param group {gi}: {why}")
    grouped = {id(p) for g in optimizer.param_groups for p in g["params"]}
    missing = [n for n, p in named_tensors(model) if p.requires_grad and id(p) not in grouped]
    if missing:
        raise UsageError(f"{len(missing)} trainable parameters are in no param group of the optimizer: "
                         f"{', '.join(missing)}; freeze them (requires_grad=False) or add them")


class _Snapshot:
    """The model's own tensors (parameter storage objects and buffers), held by reference, not copied:
    `restore` puts them back exactly, so a failed offload() leaves the model as it was, bit for bit."""

    def __init__(self, model: nn.Module) -> None:
        self.params = [(p, p.data) for _, p in named_tensors(model)]
        self.buffers = [(m, n, b) for m in model.modules() for n, b in m._buffers.items()]

    def restore(self) -> None:
        for p, data in self.params:
            p.grad = None
            set_data(p, data)
        for m, n, b in self.buffers:
            m._buffers[n] = b


def release_to_meta(engine: OffloadEngine, dtypes: dict[str, torch.dtype]) -> None:
    """Leave a lazily built model as it came: every parameter on the meta device (nothing materialised)."""
    engine.remove_hooks()
    for e in engine.store.entries:
        set_data(e.param, torch.empty(e.shape, dtype=dtypes.get(e.name, e.dtype), device="meta"))
        e.bound = False


@contextmanager
def offload(model: nn.Module, optimizer: torch.optim.Optimizer | None, budgets: Budgets,
            profile: Profile | None = None, *, policy: str = "tencache", device: torch.device | None = None,
            dtype: torch.dtype = torch.bfloat16, accumulate: int = 1, clip_norm: float | None = None,
            init: Mapping[str, torch.Tensor] | None = None,
            progress: ProgressNote | None = None, ranks: RankGroup | None = None) -> Iterator[OffloadEngine]:
    """Place `model`'s parameters and AdamW state across device, CPU and NVMe for the `with` block.
    `accumulate`: backward passes per optimizer step (one more raises); `clip_norm`: global-norm clipping.
    `init`: fp32 initial values by parameter name for a model built on the meta device (`LazyInit.weights`),
    generated one tensor at a time straight into its tier; such a model is left on the meta device at exit
    (write its weights with `engine.export(path)` inside the block). If entering fails, the model is left
    exactly as it was (same tensors, same dtypes, same values) and a retry may follow.
    `ranks` (under torchrun, `RankGroup.from_env(device.type)`): each rank keeps only its shard of the
    parameters and optimizer states (shards.py) and feeds its own micro-batches; `engine.backward` sums the
    gradients of every rank (as `accumulate` sums micro-batches); every rank must run the same model and
    steps, and export together (rank 0 writes); at exit every rank gets the whole model back."""
    check_optimizer(model, optimizer)
    lazy = any(p.is_meta for _, p in named_tensors(model))
    if lazy and init is None:
        raise UsageError("the model's parameters are on the meta device: pass init= (tencache.LazyInit.weights) "
                         "with their initial values")
    pin_mmap_threshold()  # freed weights go back to the kernel: host memory stays near the budgets
    device = device or pick_device()
    snapshot = _Snapshot(model)
    try:
        trainable = {id(p): i for i, (_, p) in enumerate(named_tensors(model)) if p.requires_grad}
        hyper = HyperParams.from_optimizer(optimizer, trainable)
        frozen = {n: p.data for n, p in named_tensors(model) if not p.requires_grad and p.dtype != dtype}
        buffer_dtypes = {(id(m), n): b.dtype for m in model.modules() for n, b in m._buffers.items() if b is not None}
        masters, dtypes = to_compute_dtype(model, dtype, device, keep_masters=not lazy)
        engine = OffloadEngine(model, init if lazy else masters, policy=policy, budgets=budgets, profile=profile,
                               hyper=hyper, device=device, accumulate=accumulate, clip_norm=clip_norm,
                               progress=progress, ranks=ranks)
    except BaseException:
        snapshot.restore()
        raise
    del masters, snapshot
    release_freed_heap()  # the model's own storage, now in the tiers
    try:
        yield engine
    finally:
        try:
            if lazy:
                release_to_meta(engine, dtypes)
            else:
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
