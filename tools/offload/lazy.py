"""Build a model without materialising it, and initialise each parameter on its own, after deepspeed.zero.Init.

    from mlsyskit.tools.offload import LazyInit, offload
    with LazyInit(seed=0) as lazy:
        model = MyModel()                            # every parameter on the meta device: no memory
    with offload(model, opt, budgets, prof, init=lazy.weights(model)) as engine:   # each tensor into its tier
        ...
        engine.export("model.safetensors")           # consolidated weights, written one tensor at a time

A parameter's initial value comes from its owning module's `reset_parameters()` (torch's own modules all
have one) run on a CPU twin of that module alone, with torch's RNG seeded by sub_seed(seed,
"init:<module name>"): a value depends only on the seed and the module's name, never on which tensors
were generated before, so the engine can generate them one at a time in any order. `LazyInit.materialize`
is the plain build with exactly these values (all in memory), for a reference run. Buffers (BatchNorm's
running statistics: small) are materialised on the CPU by `weights()`. A module that owns parameters but
has no reset_parameters() is refused, by name: its initialisation lives in its __init__, which ran on meta.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping

import torch
from torch import nn

from mlsyskit.core.errors import UsageError
from mlsyskit.core.sim import sub_seed
from mlsyskit.tools.offload.profiler import named_tensors


def _gen_dtype(p: torch.Tensor) -> torch.dtype:
    """Initial values are generated in fp32 whatever the parameter's dtype is now (offload() turns a lazy
    model's parameters into bf16 compute copies; the values must not change with that)."""
    return torch.float32 if p.is_floating_point() else p.dtype


def set_data(p: nn.Parameter, data: torch.Tensor) -> None:
    """`p.data = data`, also across device types (a meta parameter getting real storage, or going back to
    meta), where torch refuses set_data: the parameter's contents are swapped, its identity kept (the
    user's optimizer and the engine's hooks still refer to the same object)."""
    if p.device.type == data.device.type:
        p.data = data
    else:
        torch.utils.swap_tensors(p, nn.Parameter(data, requires_grad=p.requires_grad))
        if p._post_accumulate_grad_hooks is not None and not p._post_accumulate_grad_hooks:
            # the hook table registered earlier (profiling) stays with the Python object while its C++ hook
            # stayed with the old tensor: without a reset, a new hook would be stored but never called
            p._post_accumulate_grad_hooks = None


class LazyInit:
    """`with LazyInit(seed) as lazy: model = M()` builds on the meta device; see the module docstring."""

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self._device = torch.device("meta")

    def __enter__(self) -> LazyInit:
        self._device.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._device.__exit__(*exc)

    def module_values(self, mname: str, module: nn.Module) -> dict[str, torch.Tensor]:
        """The values of `module`'s direct parameters (fp32 when floating) and buffers, by local name."""
        twin = nn.Module.__new__(type(module))
        twin.__dict__ = dict(module.__dict__)
        twin.__dict__["_parameters"] = {k: None if p is None else nn.Parameter(torch.empty(p.shape, dtype=_gen_dtype(p), device="cpu"),
                                                                   requires_grad=p.requires_grad)
                            for k, p in module._parameters.items()}
        twin.__dict__["_buffers"] = {k: None if b is None else torch.empty(b.shape, dtype=b.dtype, device="cpu")
                         for k, b in module._buffers.items()}
        reset = getattr(twin, "reset_parameters", None) or getattr(twin, "_reset_parameters", None)
        if reset is None:
            if any(p is not None for p in twin._parameters.values()):
                raise UsageError(f"module {mname or '<root>'} ({type(module).__name__}) owns parameters but has no "
                                 f"reset_parameters(): it cannot be initialised lazily; give it one")
        else:
            with torch.random.fork_rng(devices=[]), torch.device("cpu"), torch.no_grad():
                torch.manual_seed(sub_seed(self.seed, f"init:{mname}"))
                reset()
        out = {k: p.detach() for k, p in twin._parameters.items() if p is not None}
        out.update({k: b for k, b in twin._buffers.items() if b is not None})
        return out

    def weights(self, model: nn.Module) -> LazyWeights:
        """Materialise the (small) buffers in place; the parameters' fp32 values as a lazy mapping."""
        for mname, module in model.named_modules():
            if any(b is not None and b.is_meta for b in module._buffers.values()):
                values = self.module_values(mname, module)
                for k, b in module._buffers.items():
                    if b is not None and b.is_meta:
                        module._buffers[k] = values[k]
        return LazyWeights(self, model)

    def materialize(self, model: nn.Module) -> nn.Module:
        """The plain build: every parameter and buffer in memory, with the values `weights()` gives."""
        for mname, module in model.named_modules():
            if not module._parameters and not module._buffers:
                continue
            values = self.module_values(mname, module)
            for k, p in module._parameters.items():
                if p is not None and p.is_meta:
                    set_data(p, values[k].to(p.dtype))
            for k, b in module._buffers.items():
                if b is not None and b.is_meta:
                    module._buffers[k] = values[k]
        return model


class LazyWeights(Mapping[str, torch.Tensor]):
    """Parameter name -> fp32 initial value, generated on access (the last module's values are kept, so a
    module's weight and bias cost one initialisation)."""

    def __init__(self, lazy: LazyInit, model: nn.Module) -> None:
        self.lazy = lazy
        self.modules = dict(model.named_modules())
        self.names = {n: None for n, _ in named_tensors(model)}  # ordered, O(1) membership
        self._cached: tuple[str, dict[str, torch.Tensor]] = ("", {})

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self.names:
            raise KeyError(name)
        mname, _, local = name.rpartition(".")
        if self._cached[0] != mname or local not in self._cached[1]:
            self._cached = (mname, self.lazy.module_values(mname, self.modules[mname]))
        return self._cached[1].pop(local).to(torch.float32)

    def __contains__(self, name: object) -> bool:  # without generating the value (Mapping's would)
        return name in self.names

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)
