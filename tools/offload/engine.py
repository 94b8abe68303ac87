"""The offload engine: wires a model's module hooks to a policy, the tiers and the CPU optimizer.

Hooks: a forward pre-hook makes the module's parameters resident on the device (measuring whether
they already were and how long the module waited), a forward hook releases them; a backward pre-hook
makes them resident again; each parameter's post-accumulate-grad hook runs the CPU Adam step on its
fp32 state (gradient copied into the state slot, update written back into the bf16 device copy) and
releases it. The engine follows its position in the profiled use order and counts deviations.
Nothing is allocated per step by the engine after warm-up except by the on-demand baseline, whose
fresh allocations are the point of that baseline and are counted.
"""
from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from mlsyskit.core.config import format_size
from mlsyskit.core.filetier import FileTier
from mlsyskit.core.memory import round_up
from mlsyskit.tools.offload.optimizer import AdamConfig, OptimizerStateCache, adam_update
from mlsyskit.tools.offload.policies import Policy, make_policy
from mlsyskit.tools.offload.policies.base import PlanContext
from mlsyskit.tools.offload.pools import BudgetError
from mlsyskit.tools.offload.profiler import Profile, model_signature, param_modules
from mlsyskit.tools.offload.tiers import CPU, DEVICE, Entry, TierStore


@dataclass(frozen=True)
class Budgets:
    device: int
    cpu: int  # parameter cache on the CPU
    optimizer: int  # optimizer-state cache on the CPU
    nvme_dir: Path | None = None


@dataclass
class StepStats:
    tensor_uses: int = 0
    device_hits: int = 0
    fetch_wait_s: float = 0.0
    fetch_waits: list[float] = field(default_factory=list)
    deviations: int = 0
    optimizer_s: float = 0.0


def concurrent_by_class(model: nn.Module) -> dict[int, int]:
    """Size class -> the most tensors of that class one module holds (all resident while it runs)."""
    most: dict[int, int] = {}
    for _, _, params in param_modules(model):
        counts: dict[int, int] = {}
        for _, p in params:
            n = p.numel() * p.element_size()
            counts[n] = counts.get(n, 0) + 1
        for n, c in counts.items():
            most[n] = max(most.get(n, 0), c)
    return most


def _check_swap_room(distribution: dict[int, int], device_slots: dict[int, int], cpu_slots: dict[int, int]) -> None:
    """Without NVMe, a class that does not fit the device moves tensors between device and CPU, which needs
    one free slot of the class somewhere; device + CPU slots that hold the class exactly would deadlock."""
    short = [s for s, c in distribution.items()
             if device_slots.get(s, 0) < c and device_slots.get(s, 0) + cpu_slots.get(s, 0) <= c]
    if short:
        extra = sum(round_up(s) for s in short)
        raise BudgetError(f"without --nvme-dir, {len(short)} size class(es) (largest {format_size(max(short))}) fill "
                          f"the device and CPU slots exactly, leaving none free to swap through: raise the CPU "
                          f"budget by {format_size(extra)} or give --nvme-dir")


def pick_device(requested: str | None = None) -> torch.device:
    if requested:
        return torch.device(requested)
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


class OffloadEngine:
    """Owns the tiers for one model; use `step(loss)` after each forward (runs backward + optimizer)."""

    def __init__(self, model: nn.Module, masters: dict[str, torch.Tensor], *, policy: str | Policy,
                 budgets: Budgets, profile: Profile | None, adam: AdamConfig, device: torch.device | None = None,
                 states: dict[str, tuple[torch.Tensor, torch.Tensor]] | None = None, adam_step: int = 0) -> None:
        self.model = model
        self.policy = make_policy(policy) if isinstance(policy, str) else policy
        if self.policy.needs_profile and profile is None:
            raise ValueError(f"policy {self.policy.name!r} needs a profile")
        if profile is not None:
            profile.check_model(model)
        self.profile = profile
        self.signature = model_signature(model)  # before the parameters' storage moves into the tiers
        self.device = device or pick_device()
        self.emulated = self.device.type != "cuda"
        self.adam = adam
        self.adam_step = adam_step
        self.nvme = FileTier(budgets.nvme_dir) if budgets.nvme_dir is not None else None
        named = list(model.named_parameters())
        entries = [Entry(i, n, p, p.shape, p.dtype, p.numel() * p.element_size()) for i, (n, p) in enumerate(named)]
        self.by_name = {e.name: e for e in entries}
        ctx = PlanContext(sizes={e.idx: e.nbytes for e in entries}, model_order=[e.idx for e in entries],
                          profile=profile, device_budget=budgets.device, cpu_budget=budgets.cpu,
                          has_nvme=self.nvme is not None, concurrent=concurrent_by_class(model))
        plan = self.policy.plan(ctx)
        if plan.placement.nvme and self.nvme is None:
            raise BudgetError(f"{len(plan.placement.nvme)} parameter tensors do not fit the device and CPU budgets "
                              f"and no --nvme-dir was given")
        if self.nvme is None and plan.device_slots is not None:
            _check_swap_room(ctx.distribution, plan.device_slots, plan.cpu_slots)
        self.store = TierStore(entries, device=self.device, device_slots=plan.device_slots,
                               cpu_slots=plan.cpu_slots, nvme=self.nvme)
        self._populate(plan)
        self.policy.attach(self.store, ctx)
        order = profile.optimizer_order if profile is not None else [e.idx for e in reversed(entries)]
        self.states = OptimizerStateCache({e.idx: e.shape.numel() for e in entries},
                                          order, budgets.optimizer, self.nvme,
                                          read_ahead=self.policy.prefetches)
        for e in entries:
            m, v = states[e.name] if states is not None else (None, None)
            self.states.initialize(e.idx, masters[e.name], m, v)
        self._uses = [(u.module, u.phase) for u in profile.uses] if profile is not None else []
        self._cursor = 0
        self._pos: int | None = None
        self.stats = StepStats()
        self._hooks: list[Any] = []
        self._saved_guard: Any = None
        dev_pool = self.store.dev_pool
        self._arena_ptr = dev_pool.arena.untyped_storage().data_ptr() if dev_pool is not None else -1
        self._install_hooks()

    # -- setup --------------------------------------------------------------------------------------
    def _populate(self, plan) -> None:
        st = self.store
        for e in st.entries:
            data = e.param.data.reshape(-1).view(torch.uint8)
            tier = plan.placement.tier_of(e.idx)
            if tier == DEVICE and st.dev_pool is not None:
                e.dev = st.dev_pool.acquire(e.nbytes, e.idx, exact=True)
                e.dev.data[:e.nbytes].copy_(data)
            elif tier in (CPU, DEVICE):
                e.cpu = st.cpu_pool.acquire(e.nbytes, e.idx, exact=True)
                e.cpu.data[:e.nbytes].copy_(data)
                tier = CPU
            else:
                self.nvme.write(e.key, data.contiguous().numpy(), e.nbytes)
            e.where = tier
            st.unbind(e)  # the model's own storage is freed; parameters live in the tiers now

    def _install_hooks(self) -> None:
        for mname, module, params in param_modules(self.model):
            entries = [self.by_name[n] for n, _ in params]
            self._hooks.append(module.register_forward_pre_hook(
                lambda m, a, n=mname, es=entries: self._acquire(n, "forward", es)))
            self._hooks.append(module.register_forward_hook(
                lambda m, a, o, n=mname, es=entries: self._release_forward(es)))
            self._hooks.append(module.register_full_backward_pre_hook(
                lambda m, g, n=mname, es=entries: self._acquire(n, "backward", es)))
            for e in entries:
                self._hooks.append(e.param.register_post_accumulate_grad_hook(
                    lambda p, e=e: self._on_grad(e)))

    # -- hooks ----------------------------------------------------------------------------------------
    def _position(self, module: str, phase: str) -> int | None:
        if not self._uses:
            self._pos = None
            return None
        n = len(self._uses)
        if self._cursor < n and self._uses[self._cursor] == (module, phase):
            pos = self._cursor
        else:
            later = [i for i in range(self._cursor, n) if self._uses[i] == (module, phase)]
            self.stats.deviations += 1
            pos = later[0] if later else None
        if pos is not None:
            self._cursor = pos + 1
        self._pos = pos
        return pos

    def _acquire(self, module: str, phase: str, entries: list[Entry]) -> None:
        pos = self._position(module, phase)
        hits = sum(1 for e in entries if self.store.ready_on_device(e))
        t0 = time.perf_counter()
        self.policy.acquire(pos, entries)
        if self.device.type == "cuda":
            torch.cuda.current_stream().wait_stream(self.store.mover._stream)
        waited = time.perf_counter() - t0 if hits < len(entries) else 0.0
        s = self.stats
        s.tensor_uses += len(entries)
        s.device_hits += hits
        s.fetch_wait_s += waited
        s.fetch_waits.append(waited)

    def _release_forward(self, entries: list[Entry]) -> None:
        self.policy.release(self._pos, entries, updated=False)

    def _on_grad(self, e: Entry) -> None:
        t0 = time.perf_counter()
        grad = e.param.grad
        master, m, v, g32 = self.states.get(e.idx)
        g32.copy_(grad.reshape(-1))  # bf16 -> fp32 (device -> host on a GPU)
        e.param.grad = None
        adam_update(master, g32, m, v, self.adam_step + 1, self.adam)
        self.store.device_view(e).view(-1).copy_(master)  # fp32 -> bf16 compute copy
        self.states.put(e.idx)
        self.stats.optimizer_s += time.perf_counter() - t0
        self.policy.release(self._pos, [e], updated=True)

    # -- step -----------------------------------------------------------------------------------------
    def begin_step(self) -> None:
        self._cursor = 0
        self.stats = StepStats()
        self.states.begin_step()
        if self.store.dev_pool is not None and self._saved_guard is None:
            self._saved_guard = torch.autograd.graph.saved_tensors_hooks(self._check_saved, lambda t: t)
            self._saved_guard.__enter__()

    def _check_saved(self, t: torch.Tensor) -> torch.Tensor:
        """Autograd may keep a Parameter for backward (its storage is swapped back in before use) but not
        a view of a parameter's device slot: that slot holds another tensor by the time backward runs."""
        if not isinstance(t, nn.Parameter) and t.device == self.device and \
                t.untyped_storage().data_ptr() == self._arena_ptr:
            raise RuntimeError("a module saved a view of an offloaded parameter for backward (e.g. torch.nn.Linear "
                               "saves weight.t()); use mlsyskit.tools.offload.model.Linear, nn.LayerNorm and "
                               "nn.Embedding, or policy='on-demand'")
        return t

    def backward(self, loss: torch.Tensor) -> None:
        """Backward pass with the CPU optimizer step applied per parameter as its gradient is ready."""
        if self._saved_guard is not None:
            self._saved_guard.__exit__(None, None, None)
            self._saved_guard = None
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Full backward hook is firing")
            loss.backward()
        self.adam_step += 1
        self.policy.end_step()

    def remove_hooks(self) -> None:
        if self._saved_guard is not None:
            self._saved_guard.__exit__(None, None, None)
            self._saved_guard = None
        for h in self._hooks:
            h.remove()
        self._hooks.clear()

    # -- inspection and export ------------------------------------------------------------------------
    def export_states(self) -> dict[str, torch.Tensor]:
        """fp32 master|m|v per parameter name (3*numel), for checkpoints and for handing the model back."""
        self.states.flush()
        out = {}
        for e in self.store.entries:
            buf = torch.empty(3 * e.shape.numel(), dtype=torch.float32)
            self.states.export(e.idx, buf)
            out[e.name] = buf
        return out

    def materialize(self) -> None:
        """Give every parameter ordinary bf16 storage again, from its master weight (after training)."""
        for name, state in self.export_states().items():
            e = self.by_name[name]
            e.param.data = state[:e.shape.numel()].view(e.shape).to(e.dtype)

    def occupancy(self) -> dict[str, Any]:
        st = self.store
        dev_cap = st.dev_pool.capacity_bytes if st.dev_pool is not None else 0
        return {"bytes": st.occupancy(), "device_capacity": dev_cap, "cpu_capacity": st.cpu_pool.capacity_bytes,
                "optimizer_capacity": self.states.pool.capacity_bytes,
                "optimizer_nvme_tensors": self.states.nvme_homed,
                "device_pool_in_use": st.dev_pool.stats.bytes_in_use if st.dev_pool is not None else 0,
                "cpu_pool_in_use": st.cpu_pool.stats.bytes_in_use}

    def allocations(self) -> int:
        st = self.store
        pools = [st.cpu_pool, self.states.pool] + ([st.dev_pool] if st.dev_pool is not None else [])
        return st.stats.allocations + sum(p.stats.allocations for p in pools)

    def close(self) -> None:
        self.remove_hooks()
        self.store.close()
        self.states.close()
        if self.nvme is not None:
            self.nvme.close()
