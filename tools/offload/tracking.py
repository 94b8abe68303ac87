"""Where a model uses its parameters, for any nn.Module: the same tracker drives profiling and the engine.

A parameter is *held* while something may read its storage; a host (the profiler's recorder or the
offload engine) is told when a tensor must become resident (`acquire`) and when it may leave (`release`).
Three ways a model reads a parameter, and how each is caught:

* its module runs: forward pre-hook / forward hook, and the backward pre-hook of a module (label = the
  module's name); a backward hold ends at the next backward event (the module's backward nodes run
  before it: a node that runs later and still needs the tensor finds it through its saved reference).
  Gradient hooks only report the gradient (the host updates the tensor wherever it lives), so a shared
  module or a tied weight is not pinned on the device until its gradient is complete.
* functional use by another module (a tied head `x @ self.tok.weight.t()`, nn.MultiheadAttention passing
  `out_proj.weight` to F.multi_head_attention_forward): a TorchFunctionMode active during the forward sees
  every torch call whose arguments include a tracked Parameter that is not held, acquires it (label
  `fn:<name>`) and holds it until the next module event, or, when the call returned a view of the
  parameter, until that view is garbage-collected.
* autograd saving the parameter or a view of it (nn.Linear saves `weight.t()`): saved_tensors_hooks pack
  it as a reference (tensor + view geometry) instead of a view of storage that will hold another tensor
  by the time backward runs; unpacking makes the tensor resident again (label `saved:<name>` when it was
  not held) and rebuilds the view. A saved reference to a tensor whose update already ran is refused.

Tensors are identified by Parameter identity, so tied weights (one Parameter owned by two modules) are one
tensor. Uses are reported in execution order with the same labels in profiling and training, so the
profiled order predicts the engine's acquisitions.
"""
from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any, Protocol

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

FORWARD, BACKWARD = "forward", "backward"


class UnsupportedModelError(ValueError):
    """A model feature the offload engine cannot run correctly; the message names the module or parameter."""


class Tracked(Protocol):
    idx: int
    name: str
    param: nn.Parameter
    trainable: bool


class Host(Protocol):
    def acquire(self, label: str, phase: str, entries: list[Any]) -> None: ...

    def release(self, entries: list[Any]) -> None: ...

    def grad_ready(self, entry: Any) -> None: ...

    def updated(self, entry: Any) -> bool: ...


def owning_modules(model: nn.Module, by_id: dict[int, Any]) -> list[tuple[str, nn.Module, list[Any]]]:
    """(module name, module, tracked tensors it owns directly) for every module owning parameters;
    a tied Parameter appears under each module that owns it."""
    out = []
    for mname, module in model.named_modules(remove_duplicate=False):
        owned = [by_id[id(p)] for _, p in module.named_parameters(recurse=False, remove_duplicate=False)]
        if owned:
            out.append((mname, module, list(dict.fromkeys(owned))))
    seen: set[int] = set()
    unique = []
    for mname, module, owned in out:  # a module registered twice (shared block) is hooked once
        if id(module) not in seen:
            seen.add(id(module))
            unique.append((mname, module, owned))
    return unique


class _SavedRef:
    """A parameter (or a view of it) saved for backward, kept as tensor + view geometry, not as storage."""

    __slots__ = ("entry", "whole", "size", "stride", "offset", "dtype")

    def __init__(self, entry: Any, t: torch.Tensor, base: torch.Tensor) -> None:
        self.entry = entry
        self.whole = t is entry.param
        self.size, self.stride = tuple(t.shape), tuple(t.stride())
        self.offset = t.storage_offset() - base.storage_offset()
        self.dtype = t.dtype


class _FunctionalUses(TorchFunctionMode):
    def __init__(self, tracker: UseTracker) -> None:
        super().__init__()
        self.tracker = tracker

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        tr = self.tracker
        if tr.busy:
            return func(*args, **kwargs)
        used = tr.unheld_params(args, kwargs)
        if used:
            tr.functional_use(used)
        out = func(*args, **kwargs)
        if used and isinstance(out, torch.Tensor):
            tr.keep_if_view(out, used)
        return out


class UseTracker:
    """Installs the hooks on `model` and reports acquisitions and releases to `host` (see module doc)."""

    def __init__(self, model: nn.Module, entries: list[Any], host: Host) -> None:
        self.model = model
        self.host = host
        self.by_id = {id(e.param): e for e in entries}
        self.holds: dict[int, int] = {}  # entry idx -> holders (modules, functional uses, live views); > 0 only
        self._held: dict[int, Any] = {}  # entry idx -> entry, for every idx in holds (what _pack scans)
        self.transient: list[Any] = []  # held by a functional use or a saved-ref fetch until the next event
        self.backward_held: list[Any] = []  # held by the last backward module use
        self.busy = False
        self.guard_ptrs: set[int] = set()  # storages that only tracked tensors live in (the device arena)
        self._hooks: list[Any] = []
        self._mode: _FunctionalUses | None = None
        self._saved: Any = None
        # activations: bytes of the storages autograd saves for backward (parameters excluded), per forward
        self._saved_storages: dict[int, int] = {}
        self.saved_bytes = 0  # of the last forward
        self.peak_saved_bytes = 0  # the most of any forward since the tracker was installed
        self._install()

    # -- hooks ------------------------------------------------------------------------------------------
    def _install(self) -> None:
        # the root's pre-hook opens the forward (functional-use mode, saved-tensor hooks) before any module
        # runs; its forward hook, registered last, closes it after every other hook of the root
        self._hooks.append(self.model.register_forward_pre_hook(lambda m, a: self.begin_forward()))
        for mname, module, owned in owning_modules(self.model, self.by_id):
            self._hooks.append(module.register_forward_pre_hook(
                lambda m, a, n=mname, es=owned: self._module_start(n, FORWARD, es)))
            self._hooks.append(module.register_forward_hook(
                lambda m, a, o, es=owned: self._module_end(es, o)))
            self._hooks.append(module.register_full_backward_pre_hook(
                lambda m, g, n=mname, es=owned: self._module_start(n, BACKWARD, es)))
        for e in self.by_id.values():
            if e.trainable:
                self._hooks.append(e.param.register_post_accumulate_grad_hook(lambda p, e=e: self._grad(e)))
        self._hooks.append(self.model.register_forward_hook(lambda m, a, o: self.end_forward()))

    def begin_forward(self) -> None:
        """Enter the functional-use mode and the saved-tensor hooks for one forward pass."""
        if self._mode is not None:
            return
        self._saved_storages = {}
        self._saved = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._saved.__enter__()
        self._mode = _FunctionalUses(self)
        self._mode.__enter__()

    def end_forward(self) -> None:
        if self._mode is None:
            return
        self._mode.__exit__(None, None, None)
        self._saved.__exit__(None, None, None)
        self._mode, self._saved = None, None
        self.saved_bytes = sum(self._saved_storages.values())
        self.peak_saved_bytes = max(self.peak_saved_bytes, self.saved_bytes)
        self._saved_storages = {}
        self._drop_transient()

    def end_backward(self) -> None:
        """After backward: nothing may still be held by a backward use."""
        self._drop_transient()
        self._drop_backward_held()
        for e in self.by_id.values():  # nothing but live views may hold a tensor between passes
            views = getattr(e, "view_refs", 0)
            if self.holds.get(e.idx, 0) > views:
                self._set_holds(e, views)
                if views == 0:
                    self._call(self.host.release, [e])

    def remove(self) -> None:
        self.end_forward()
        for h in self._hooks:
            h.remove()
        self._hooks.clear()

    # -- holding --------------------------------------------------------------------------------------
    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        self.busy = True
        try:
            return fn(*args)
        finally:
            self.busy = False

    def _hold(self, label: str, phase: str, entries: list[Any]) -> None:
        self._call(self.host.acquire, label, phase, entries)
        for e in entries:
            self._set_holds(e, self.holds.get(e.idx, 0) + 1)

    def _unhold(self, entries: list[Any]) -> None:
        gone = []
        for e in entries:
            n = self.holds.get(e.idx, 0) - 1
            self._set_holds(e, n)
            if n == 0:
                gone.append(e)
        if gone:
            self._call(self.host.release, gone)

    def _set_holds(self, e: Any, n: int) -> None:
        if n > 0:
            self.holds[e.idx] = n
            self._held[e.idx] = e
        else:
            self.holds.pop(e.idx, None)
            self._held.pop(e.idx, None)

    def held(self, e: Any) -> bool:
        return e.idx in self.holds

    def _drop_transient(self) -> None:
        if self.transient:
            entries, self.transient = self.transient, []
            self._unhold(entries)

    def _drop_backward_held(self) -> None:
        if self.backward_held:
            entries, self.backward_held = self.backward_held, []
            self._unhold(entries)

    def _module_start(self, name: str, phase: str, entries: list[Any]) -> None:
        self._drop_transient()
        if phase == BACKWARD:
            self._drop_backward_held()
        self._hold(name, phase, entries)
        if phase == BACKWARD:
            self.backward_held.extend(entries)

    def _module_end(self, entries: list[Any], output: Any) -> None:
        self._drop_transient()
        for t in _tensors(output):
            self.keep_if_view(t, entries)
        self._unhold(entries)

    def _grad(self, e: Any) -> None:
        self._call(self.host.grad_ready, e)

    # -- functional uses ------------------------------------------------------------------------------
    def unheld_params(self, args: tuple, kwargs: dict) -> list[Any]:
        # every torch call of the forward comes here: look tracked Parameters up by identity (a live object's
        # id is unique) rather than isinstance(t, nn.Parameter), whose metaclass check runs in Python
        found = []
        by_id, holds = self.by_id, self.holds
        for a in (*args, *kwargs.values()):
            for t in (a if isinstance(a, (list, tuple)) else (a,)):
                e = by_id.get(id(t))
                if e is not None and e.idx not in holds and e not in found:
                    found.append(e)
        return found

    def functional_use(self, entries: list[Any]) -> None:
        for e in entries:
            self._hold(f"fn:{e.name}", FORWARD, [e])
            self.transient.append(e)

    def keep_if_view(self, out: torch.Tensor, entries: list[Any]) -> None:
        """A returned view of a held tensor's storage keeps the tensor held until the view is freed."""
        if out.untyped_storage().nbytes() == 0:
            return
        ptr = out.untyped_storage().data_ptr()
        for e in entries:
            data = e.param.data
            if data.numel() and data.untyped_storage().data_ptr() == ptr and _overlaps(out, data):
                self._set_holds(e, self.holds.get(e.idx, 0) + 1)
                e.view_refs = getattr(e, "view_refs", 0) + 1
                weakref.finalize(out, self._view_freed, e)

    def _view_freed(self, e: Any) -> None:
        e.view_refs -= 1
        self._unhold([e])

    # -- saved tensors ----------------------------------------------------------------------------------
    def _pack(self, t: torch.Tensor) -> Any:
        if isinstance(t, nn.Parameter):
            e = self.by_id.get(id(t))
            return _SavedRef(e, t, t) if e is not None else t
        if t.layout != torch.strided or t.untyped_storage().nbytes() == 0:
            return t
        if t.is_meta:  # no storage address to match (profiling a lazily built model): an activation, counted once
            self._saved_storages[id(t)] = t.untyped_storage().nbytes()
            return t
        ptr = t.untyped_storage().data_ptr()
        # only held tensors can be read now (the others point at placeholders); scanned in index order, so
        # of several overlapping parameters the first one's reference is saved, as over all of them
        for idx in sorted(self._held):
            e = self._held[idx]
            data = e.param.data
            if data.numel() and data.untyped_storage().data_ptr() == ptr and _overlaps(t, data):
                if t.dtype != data.dtype:
                    raise UnsupportedModelError(f"autograd saved a {t.dtype} reinterpretation of parameter "
                                                f"{e.name} ({data.dtype}); offloading cannot restore it")
                return _SavedRef(e, t, data)
        if ptr in self.guard_ptrs:
            raise UnsupportedModelError("autograd saved a view of an offloaded parameter that no module or call "
                                        "holds (read through .data or a cached view?); it would be overwritten "
                                        "before backward")
        # an activation: saved tensors live until backward, so their storages are distinct while counted
        self._saved_storages[ptr] = t.untyped_storage().nbytes()
        return t

    def _unpack(self, ref: Any) -> torch.Tensor:
        if not isinstance(ref, _SavedRef):
            return ref
        e = ref.entry
        if self.host.updated(e):
            raise UnsupportedModelError(f"backward needs parameter {e.name} after the optimizer updated it "
                                        f"(its gradient was complete before another use read it, e.g. through "
                                        f".detach()); this model cannot be offloaded with per-tensor updates")
        if not self.held(e):
            self._drop_transient()
            self._hold(f"saved:{e.name}", BACKWARD, [e])
            self.transient.append(e)
        if ref.whole:
            return e.param
        base = e.param.data
        return base.as_strided(ref.size, ref.stride, base.storage_offset() + ref.offset)


def _overlaps(t: torch.Tensor, base: torch.Tensor) -> bool:
    start = base.data_ptr()
    end = start + base.numel() * base.element_size()
    return start <= t.data_ptr() < end


def _tensors(obj: Any) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for o in obj for t in _tensors(o)]
    if isinstance(obj, dict):
        return [t for o in obj.values() for t in _tensors(o)]
    return []
