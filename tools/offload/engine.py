"""The offload engine: the use tracker's host, wiring a model's uses to a policy, the tiers and the CPU optimizer.

`tracking.UseTracker` reports when a tensor must be resident (a module runs, a functional use, a saved
view needed by backward) and when it may leave; the engine measures whether it already was and how long
the use waited (look-ahead bookkeeping included), and asks the policy to make it resident or release it.
Gradients go to the CPU optimizer per tensor as they arrive (updates.py). The engine follows its position
in the profiled use order and counts deviations. Nothing is allocated per step after warm-up except by the
on-demand baseline, whose fresh allocations are counted.

Building checks every budget before any parameter moves (plan, optimizer-state cache, pools), then
populates the tiers one tensor at a time: a parameter on the meta device gets its value from `masters`
(a mapping that may generate each fp32 tensor on access), straight into its tier, so a model larger than
host memory is never materialised. A failed build releases everything it took; the caller's model keeps
whatever storage it had (api.offload restores the user's tensors bit for bit).
"""
from __future__ import annotations

import math
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from mlsyskit.core.errors import UsageError
from mlsyskit.tools.offload.filetier import FileTier
from mlsyskit.tools.offload.gather import Gatherer
from mlsyskit.tools.offload.gpu_stats import DeviceFigures
from mlsyskit.tools.offload.grad_pipeline import GradStager, OptimizerWorker
from mlsyskit.tools.offload.lazy import set_data
from mlsyskit.tools.offload.nvme_run import NvmeRun
from mlsyskit.tools.offload.optimizer import HyperParams, NonFiniteError, OptimizerStateCache
from mlsyskit.tools.offload.policies import Policy, make_policy
from mlsyskit.tools.offload.policies.base import PlanContext
from mlsyskit.tools.offload.pools import BudgetError
from mlsyskit.tools.offload.profiler import Profile, model_signature, named_tensors
from mlsyskit.tools.offload.progress import ProgressNote
from mlsyskit.tools.offload.ranks import RankError, RankGroup
from mlsyskit.tools.offload.shards import Shards, own_profile, tensor_cost
from mlsyskit.tools.offload.sizing import check_swap_room, concurrent_by_class
from mlsyskit.tools.offload.state_io import StateIO
from mlsyskit.tools.offload.streams import StreamOps
from mlsyskit.tools.offload.tiers import REMOTE, Entry, TierStore
from mlsyskit.tools.offload.tracking import BACKWARD, UseTracker
from mlsyskit.tools.offload.updates import MISUSED_BACKWARD, GradientUpdates

STAGING_DEPTH = 2  # pinned gradient staging slots per size class (GPU): gradients in flight to the worker


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


def pick_device(requested: str | None = None) -> torch.device:
    if requested:
        return torch.device(requested)
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


class OffloadEngine(GradientUpdates, StateIO):
    """Owns the tiers for one model: `begin_step()`, then forward and `backward(loss)` `accumulate` times."""

    def __init__(self, model: nn.Module, masters: Mapping[str, torch.Tensor], *, policy: str | Policy,
                 budgets: Budgets, profile: Profile | None, hyper: HyperParams, device: torch.device | None = None,
                 states: dict[str, tuple[torch.Tensor, torch.Tensor]] | None = None, adam_step: int = 0,
                 accumulate: int = 1, clip_norm: float | None = None, nvme_run: NvmeRun | None = None,
                 streams: StreamOps | None = None, optimizer_depth: int = 4,
                 progress: ProgressNote | None = None, ranks: RankGroup | None = None) -> None:
        if accumulate < 1:
            raise UsageError(f"accumulate must be >= 1, got {accumulate}")
        if clip_norm is not None and not (math.isfinite(clip_norm) and clip_norm > 0):
            raise UsageError(f"clip_norm must be a positive finite number, got {clip_norm}")
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
        self.device_budget = budgets.device
        self.hyper = hyper
        self.adam_step = adam_step
        self.accumulate = accumulate
        self.clip_norm = clip_norm
        self.progress = progress
        self.ranks = ranks  # several ranks: each owns a shard of the tensors (shards.py, gather.py)
        self.shards: Shards | None = None
        self.gatherer: Gatherer | None = None
        self._in_backward = self._stepping = False
        self._step_hook: Any = None
        self._own_run = nvme_run is None and budgets.nvme_dir is not None
        self.nvme_run = NvmeRun.open(budgets.nvme_dir) if self._own_run else nvme_run
        self.nvme: FileTier | None = None
        try:
            self._figures = None if self.emulated else DeviceFigures.open(self.device.index or 0)
            self.nvme = FileTier(self.nvme_run.path) if self.nvme_run is not None else None
            self._build(model, masters, budgets, profile, states, accumulate, clip_norm, adam_step, streams,
                        optimizer_depth)
            if self.ranks is not None:  # every rank built, or all fail now naming the rank that did not
                self.ranks.agree(None, "building the engine")
        except BaseException as exc:
            if self.ranks is not None and not isinstance(exc, RankError):
                self.ranks.agree(exc, "building the engine")
            self.close()  # releases whatever the build took (threads, pools, hooks, this run's NVMe blocks)
            raise

    def _build(self, model, masters, budgets, profile, states, accumulate, clip_norm, adam_step, streams,
               optimizer_depth) -> None:
        entries = [Entry(i, n, p, p.shape, p.dtype, p.numel() * p.element_size(), trainable=p.requires_grad)
                   for i, (n, p) in enumerate(named_tensors(model))]
        self.by_name = {e.name: e for e in entries}
        self.trainable = [e for e in entries if e.trainable]
        if self.ranks is not None:  # ZeRO-3 style: this rank's tiers and optimizer hold only its own tensors
            costs = {e.idx: tensor_cost(e.nbytes, e.shape.numel(), e.trainable) for e in entries}
            self.shards = Shards.of(costs, self.ranks.rank, self.ranks.world)
            profile = own_profile(profile, self.shards) if profile is not None else None
        own = [e for e in entries if self.owns(e)]
        own_trainable = [e for e in self.trainable if self.owns(e)]
        lazy = [e.name for e in entries if e.param.is_meta and e.name not in masters]
        if lazy:
            raise UsageError(f"{len(lazy)} parameters are on the meta device without an initial value (e.g. "
                             f"{lazy[0]}): pass init= (see tencache.init) or build the model on the CPU")
        ctx = PlanContext(sizes={e.idx: e.nbytes for e in own}, model_order=[e.idx for e in own],
                          profile=profile, device_budget=budgets.device, cpu_budget=budgets.cpu,
                          has_nvme=self.nvme is not None,
                          concurrent=concurrent_by_class(model, entries, {e.idx for e in own}))
        plan = self.policy.plan(ctx)
        if plan.placement.nvme and self.nvme is None:
            raise BudgetError(f"{len(plan.placement.nvme)} parameter tensors do not fit the device and CPU budgets "
                              f"and no --nvme-dir was given")
        if self.nvme is None and plan.device_slots is not None:
            check_swap_room(ctx.distribution, plan.device_slots, plan.cpu_slots)
        trainable_ids = {e.idx for e in own_trainable}
        order = ([i for i in profile.optimizer_order if i in trainable_ids] if profile is not None
                 else [e.idx for e in reversed(own_trainable)])
        # every policy reads NVMe-homed optimizer states ahead in gradient order (baselines: reverse model
        # order), so the policies differ only in how they place and move parameters. Built (its budget
        # checked) before any parameter moves
        self.states = OptimizerStateCache({e.idx: e.shape.numel() for e in own_trainable},
                                          order, budgets.optimizer, self.nvme, read_ahead=True,
                                          persist_grad=accumulate > 1 or clip_norm is not None)
        self.store = TierStore(entries, device=self.device, device_slots=plan.device_slots,
                               cpu_slots=plan.cpu_slots, nvme=self.nvme, streams=streams)
        self.param_steps = {e.idx: adam_step for e in self.trainable}
        self._uses = [(u.module, u.phase) for u in profile.uses] if profile is not None else []
        self._cursor = 0
        self._pos: int | None = None
        self.stats = StepStats()
        self._micro = accumulate  # backward passes done in this step; begin_step() resets it
        self._updated: set[int] = set()
        self._sumsq: dict[int, float] = {}
        self._got: set[int] = set()  # tensors with a gradient in this step (the first pass copies, later add)
        self._configs: dict = {}
        counts: dict[int, int] = {}
        for e in own_trainable:  # several ranks: the owner stages the fp32 sum of the ranks' gradients
            n = 4 * e.shape.numel() if self.shards is not None else e.nbytes
            counts[n] = counts.get(n, 0) + 1
        # the new compute copy goes back into its tier from the staging slot (its own NVMe staging too)
        self.stager = GradStager(self.store.mover.streams, counts, STAGING_DEPTH, write=self._write_back)
        self._worker_s = 0.0  # job time (jobs never overlap); merged into stats when the worker is idle
        self._populate(plan, masters, states)
        if self.shards is not None:
            self.gatherer = Gatherer(self.ranks, self.shards, self.store)
        self.policy.attach(self.store, ctx)
        self.tracker = UseTracker(model, entries, self)
        if self.store.dev_pool is not None:
            self.tracker.guard_ptrs.add(self.store.dev_pool.arena.untyped_storage().data_ptr())
        if hyper_opt := self.hyper.optimizer:  # the user's own opt.step() would update nothing: refuse it
            self._step_hook = hyper_opt.register_step_pre_hook(self._guard_step)
        self.worker = OptimizerWorker(optimizer_depth)  # last: nothing after it can fail and leak the thread
        self.stager.run_job = self.worker.run_oldest

    # -- setup --------------------------------------------------------------------------------------
    def _populate(self, plan, masters: Mapping[str, torch.Tensor], states) -> None:
        """Each tensor's optimizer state and compute copy into its tier, one tensor at a time (a lazy
        mapping generates each fp32 value once, here)."""
        st = self.store
        n = len(st.entries)
        for k, e in enumerate(st.entries):
            if self.progress is not None:
                self.progress.set("populating tiers: {} of {} tensors", k, n)
            lazy = e.param.is_meta
            if not self.owns(e):  # another rank's: never generated or held here, gathered for each use
                e.where = REMOTE
                if lazy:
                    set_data(e.param, st.placeholders[e.dtype])
                st.unbind(e)
                continue
            master = masters[e.name] if e.trainable or lazy else None
            if e.trainable:
                m, v = states[e.name] if states is not None else (None, None)
                self.states.initialize(e.idx, master, m, v)
            if lazy and master.is_meta:
                raise UsageError(f"parameter {e.name} is on the meta device and its initial value too")
            value = master.reshape(e.shape).to(e.dtype) if lazy else e.param.data
            data = value.reshape(-1).view(torch.uint8)
            tier = plan.placement.tier_of(e.idx)
            st.place(e, tier, data)  # a slot in its tier, or its NVMe blocks (one per chunk)
            del master, value, data
            if lazy:
                set_data(e.param, st.placeholders[e.dtype])  # off the meta device, the same Parameter object
            st.unbind(e)  # the engine drops its reference: parameters live in the tiers now

    def _write_back(self, e: Entry, values: torch.Tensor, non_blocking: bool) -> Any:
        """The new compute copy from a staging buffer into e's tier (the buffer stages an NVMe write's cast;
        several ranks stage fp32 sums: cast to the compute dtype first, the same rounding)."""
        if values.dtype != e.dtype:
            values = values.to(e.dtype)
        return self.store.write_home(e, values, values, non_blocking=non_blocking)

    def _guard_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if not self._stepping:
            raise UsageError("inside offload(), the engine runs AdamW itself as gradients arrive: do not call "
                             "optimizer.step() (engine.backward(loss) updates the parameters)")

    # -- tracker host -------------------------------------------------------------------------------
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

    def acquire(self, label: str, phase: str, entries: list[Entry]) -> None:
        """Make `entries` resident and bound; the wait counted includes the policy's look-ahead work."""
        if phase == BACKWARD and not self._in_backward:
            raise UsageError(MISUSED_BACKWARD)
        pos = self._position(label, phase)
        if self.progress is not None and self._uses:
            self.progress.set("step {}: {:.0%} of modules ({})", self.adam_step + 1, self._cursor / len(self._uses),
                              phase)
        own = entries if self.gatherer is None else [e for e in entries if self.owns(e)]
        hits = sum(1 for e in own if self.store.ready_on_device(e))
        t0 = time.perf_counter()
        # a prefetch still in flight is consumed on the compute stream by its own copy's event (the policy
        # calls TierStore.ready_for_compute): no wait on the whole copy stream, which would serialise every
        # queued prefetch behind this module
        self.policy.acquire(pos, own)
        if self.gatherer is not None:
            self.gatherer.gather(entries)  # the same entries in the same order on every rank
        waited = time.perf_counter() - t0
        s = self.stats
        s.tensor_uses += len(own)
        s.device_hits += hits
        s.fetch_wait_s += waited
        s.fetch_waits.append(waited)

    def release(self, entries: list[Entry]) -> None:
        if self.gatherer is not None:
            self.gatherer.drop(entries)
            entries = [e for e in entries if self.owns(e)]
        self.policy.release(self._pos, entries, updated=any(e.idx in self._updated for e in entries))

    def updated(self, e: Entry) -> bool:
        return e.idx in self._updated

    # -- step -----------------------------------------------------------------------------------------
    def begin_step(self) -> None:
        if 0 < self._micro < self.accumulate:
            raise UsageError(f"begin_step() after {self._micro} of {self.accumulate} backward passes: each step "
                             f"needs exactly accumulate={self.accumulate}")
        self._micro = 0
        self._cursor = 0
        self.stats = StepStats()
        self._updated.clear()
        self._sumsq.clear()
        self._got.clear()
        self._configs = self.hyper.snapshot()  # a non-finite lr stops here, before any update
        self.states.begin_step()

    def backward(self, loss: torch.Tensor) -> None:
        """Backward pass; gradients are summed in fp32 and, on the last of `accumulate` passes, the CPU
        AdamW step runs per tensor (after the global-norm clip when `clip_norm` is set)."""
        if self._micro >= self.accumulate:
            raise UsageError(f"backward pass {self._micro + 1} in a step with accumulate={self.accumulate}: call "
                             f"engine.begin_step() before each optimizer step")
        value = float(loss.detach())
        if not math.isfinite(value):
            raise NonFiniteError(f"the loss is {value} at step {self.adam_step + 1}")
        self.tracker.end_forward()
        self.store.set_backward(True)
        self._in_backward = True
        completed = False
        try:
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message="Full backward hook is firing")
                loss.backward()
            self.tracker.end_backward()
            completed = True
        finally:
            self._in_backward = False
            self.store.set_backward(False)
            error = self._join_optimizer()  # joined at step end, also when backward failed
        if completed and error is not None:
            raise error
        self._micro += 1
        self._cursor = 0
        if self._micro < self.accumulate:
            self.states.begin_step()
            return
        if self.ranks is not None:
            self._share_norms()  # every rank's squared norms: the global norm for clipping and grad_norm
        if self.clip_norm is not None:
            self._clip_and_update()
        self.adam_step += 1
        self._stepping = True
        try:
            self.hyper.step_done()  # the user's torch optimizer (and its lr_scheduler) sees the step
        finally:
            self._stepping = False
        self.policy.end_step()

    def remove_hooks(self) -> None:
        if getattr(self, "tracker", None) is not None:
            self.tracker.remove()
        if self._step_hook is not None:
            self._step_hook.remove()
            self._step_hook = None

    # -- inspection ---------------------------------------------------------------------------------------
    def occupancy(self) -> dict[str, Any]:
        st = self.store
        dev_cap = st.dev_pool.capacity_bytes if st.dev_pool is not None else 0
        return {"bytes": st.occupancy(), "device_capacity": dev_cap, "cpu_capacity": st.cpu_pool.capacity_bytes,
                "optimizer_capacity": self.states.pool.capacity_bytes,
                "optimizer_nvme_tensors": self.states.nvme_homed,
                "device_pool_in_use": st.dev_pool.stats.bytes_in_use if st.dev_pool is not None else 0,
                "grad_staging_capacity": self.stager.capacity_bytes,
                "cpu_pool_in_use": st.cpu_pool.stats.bytes_in_use, "held": self.held_bytes(),
                **({"shard": {"rank": self.shards.rank, "world": self.shards.world, "load": self.shards.load(),
                              "imbalance": self.shards.imbalance, "gather_peak_bytes": self.gatherer.peak_bytes}}
                   if self.shards is not None else {})}

    def held_bytes(self) -> dict[str, int]:
        """Bytes this process holds in its tiers, measured: pool slots in use (device, CPU parameter cache,
        optimizer states) and the NVMe files of this run (parameter and optimizer-state blocks)."""
        st = self.store
        nvme = self.nvme_run.path if self.nvme_run is not None else None
        on_disk = sum(f.stat().st_size for f in nvme.iterdir() if f.is_file()) if nvme is not None else 0
        return {"device": st.dev_pool.stats.bytes_in_use if st.dev_pool is not None else 0,
                "cpu": st.cpu_pool.stats.bytes_in_use, "optimizer": self.states.pool.stats.bytes_in_use,
                "nvme": on_disk}

    def device_figures(self) -> dict[str, float]:
        """NVML columns for the step table on a GPU (device memory used vs the device budget, utilisation,
        PCIe tx/rx; gpu_stats.DeviceFigures); empty on the emulated device or without NVML."""
        return self._figures.sample(self.device_budget) if self._figures is not None else {}

    def allocations(self) -> int:
        st = self.store
        pools = [st.cpu_pool, self.states.pool] + [p for p in (st.dev_pool, self.stager.pool) if p is not None]
        gathered = self.gatherer.allocations if self.gatherer is not None else 0
        return st.stats.allocations + sum(p.stats.allocations for p in pools) + gathered

    def close(self) -> None:
        """Release everything; also what a failed build had taken so far."""
        self.remove_hooks()
        if getattr(self, "worker", None) is not None:
            self._join_optimizer()
            self.worker.close()
        if self.gatherer is not None:
            self.gatherer.close()
        for part in ("store", "states"):
            if getattr(self, part, None) is not None:
                getattr(self, part).close()
        if self.nvme is not None:
            self.nvme.close()
        if self._own_run:
            self.nvme_run.close()  # this run's blocks are removed; checkpoints hold what --resume needs
