"""Training loops: the offloaded run (any policy) and the plain in-memory reference it must match.

Both use the same model code, the same batches (a function of seed and step: sources.py) and the same
AdamW arithmetic (`optimizer.adam_update` on fp32 master state, bf16 compute copies, gradients summed in
fp32 over `accumulate` passes, global-norm clipping: reference.PlainAdamW), so their losses are
bit-identical when the offload engine moves bytes correctly. A preset is built lazily for the offloaded
run: on the meta device, profiled there, each tensor generated straight into its tier.
"""
from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from mlsyskit.core.clock import RealClock
from mlsyskit.core.config import parse_size, require
from mlsyskit.core.errors import UsageError
from mlsyskit.core.storage_errors import MissingDirectoryError, StoragePermissionError
from mlsyskit.core.telemetry import Telemetry
from mlsyskit.tools.offload import api, sources
from mlsyskit.tools.offload.api import lr_problem, to_compute_dtype
from mlsyskit.tools.offload.engine import Budgets, OffloadEngine, pick_device
from mlsyskit.tools.offload.memory_accounting import (
    MemoryBound,
    current_rss,
    peak_rss,
    pin_mmap_threshold,
    release_freed_heap,
    warm_up_runtime,
)
from mlsyskit.tools.offload.model import PRESETS, preset
from mlsyskit.tools.offload.nvme_run import NvmeRun
from mlsyskit.tools.offload.optimizer import AdamConfig, HyperParams
from mlsyskit.tools.offload.profiler import Profile, ProfileError, named_tensors, profile_model
from mlsyskit.tools.offload.progress import ProgressNote
from mlsyskit.tools.offload.ranks import RankGroup
from mlsyskit.tools.offload.reference import PlainAdamW
from mlsyskit.tools.offload.resume import check_space, resume, save_checkpoint


@dataclass(frozen=True)
class TrainConfig:
    model: str = "gpt-tiny"  # a preset or package.module:factory (sources.py)
    batch: int = 4
    seq: int = 64
    steps: int = 10
    seed: int = 0
    lr: float = 1e-3
    policy: str = "tencache"
    device_mem: int | str = 1 << 30  # sizes accept "2GiB"-style strings (TOML, CLI)
    cpu_mem: int | str = 4 << 30
    opt_mem: int | str = 8 << 30
    nvme_dir: Path | None = None
    checkpoint_dir: Path | None = None
    checkpoint_every: int = 0
    resume: bool = False
    keep_checkpoints: int = 2
    warmup_steps: int = 1  # steps left out of the summary's means (not the lr warm-up: lr_warmup)
    device: str | None = None  # "cuda", "cpu" (emulated device); default: cuda when available
    data: str | None = None  # a token file or package.module:loader (default: the Shakespeare corpus)
    accumulate: int = 1  # backward passes (micro-batches) per optimizer step
    clip: float | None = None  # global gradient-norm clipping
    weight_decay: float = 0.0  # AdamW's decoupled weight decay
    lr_warmup: int = 0  # steps of linear lr warm-up (lr * (step + 1) / lr_warmup until then)
    export: Path | None = None  # write the final weights here (consolidated safetensors; rank 0 with several)
    rank_timeout: float = 300.0  # seconds a collective waits for the other ranks (torchrun runs) before failing

    def __post_init__(self) -> None:
        for name in ("device_mem", "cpu_mem", "opt_mem"):
            object.__setattr__(self, name, parse_size(getattr(self, name)))
        require(self.model in PRESETS or sources.is_spec(self.model),
                f"unknown model {self.model!r}: a preset ({', '.join(PRESETS)}) or package.module:factory")
        require(self.batch > 0 and self.seq > 1, "batch must be >= 1 and seq >= 2")
        require(self.model not in PRESETS or self.seq <= preset(self.model).max_seq,
                f"seq {self.seq} exceeds the maximum {preset(self.model).max_seq if self.model in PRESETS else 0} "
                f"of {self.model}")
        require(self.steps > 0, "steps must be positive")
        require(self.checkpoint_every >= 0 and self.warmup_steps >= 0, "checkpoint_every and warmup_steps must be >= 0")
        require((why := lr_problem(self.lr)) is None, f"--lr: {why}")
        require(self.lr > 0, f"--lr must be positive, got {self.lr}")
        require(self.keep_checkpoints >= 1, "keep_checkpoints must be >= 1")
        require(self.policy in ("tencache", "on-demand", "lru"),
                f"unknown policy {self.policy!r}; policies: tencache, on-demand, lru")
        require(not self.resume or self.checkpoint_dir is not None, "--resume needs --checkpoint-dir")
        require(self.accumulate >= 1 and self.lr_warmup >= 0, "accumulate must be >= 1 and lr_warmup >= 0")
        require(self.clip is None or (math.isfinite(self.clip) and self.clip > 0),
                f"clip must be a positive finite number, got {self.clip}")
        require(math.isfinite(self.rank_timeout) and self.rank_timeout > 0,
                f"rank_timeout must be a positive number of seconds, got {self.rank_timeout}")
        require(math.isfinite(self.weight_decay) and 0 <= self.weight_decay and self.lr * self.weight_decay < 1,
                f"weight_decay must be finite, >= 0 and below 1/lr, got {self.weight_decay}")


def lr_at(cfg: TrainConfig, step: int) -> float:
    """The lr of optimizer step `step` (0-based): linear warm-up over cfg.lr_warmup steps, then cfg.lr."""
    return cfg.lr * min(1.0, (step + 1) / cfg.lr_warmup) if cfg.lr_warmup else cfg.lr


@dataclass
class TrainResult:
    losses: list[float]
    steps: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)


def run_profile(cfg: TrainConfig, progress: ProgressNote | None = None) -> Profile:
    """The tensor execution order of one step. A preset is profiled on the meta device (no memory, the same
    order and optimizer order as a materialised model; its activation bytes are an upper estimate)."""
    x, y = sources.batches(cfg.data, cfg.batch, cfg.seq, cfg.seed)(0)
    if cfg.model in PRESETS:
        model, _ = sources.build(cfg.model, cfg.seed, lazy=True)
        x, y = x.to("meta"), y.to("meta")
        return profile_model(model, lambda: model(x, y), model_name=cfg.model, batch=cfg.batch, seq=cfg.seq,
                             progress=progress)
    model, _ = sources.build(cfg.model, cfg.seed)
    return api.profile(model, lambda m: m(x, y), name=cfg.model, batch=cfg.batch, seq=cfg.seq)


def _hyper(model: torch.nn.Module, cfg: TrainConfig, step: int = 0) -> HyperParams:
    ids = [i for i, (_, p) in enumerate(named_tensors(model)) if p.requires_grad]
    return HyperParams.fixed(AdamConfig(lr=lr_at(cfg, step), weight_decay=cfg.weight_decay), ids)


def train_plain(cfg: TrainConfig) -> list[float]:
    """The in-memory reference: every tensor resident, the engine's arithmetic (reference.PlainAdamW) and the
    same use tracker, moving nothing; fp32 masters from the same initial values."""
    model, initial = sources.build(cfg.model, cfg.seed)
    device = pick_device(cfg.device)
    model.to(device)
    ref = PlainAdamW(model, None, dtype=torch.bfloat16, accumulate=cfg.accumulate, clip_norm=cfg.clip, device=device)
    if initial is not None:  # a preset: the fp32 values, not the bf16 compute copies
        names = [n for n, _ in named_tensors(model)]
        for i in ref.masters:
            ref.masters[i].copy_(initial[names[i]].reshape(-1))
    ref.hyper = _hyper(model, cfg)
    data = sources.batches(cfg.data, cfg.batch, cfg.seq, cfg.seed)
    losses = []
    try:
        for step in range(cfg.steps):
            ref.hyper.groups[0]["lr"] = lr_at(cfg, step)
            ref.begin_step()
            micro = []
            for k in range(cfg.accumulate):
                x, y = data(step * cfg.accumulate + k)
                loss = model(x.to(device), y.to(device))
                ref.backward(loss)
                micro.append(loss.item())
            losses.append(math.fsum(micro) / len(micro))
    finally:
        ref.close()
    return losses


def preflight(cfg: TrainConfig, profile: Profile | None, ranks: RankGroup | None = None) -> NvmeRun | None:
    """Everything that can be refused before the model is built: folders, the --nvme-dir lock, the profile's
    batch and seq. Returns this run's share of the --nvme-dir (locked)."""
    if cfg.checkpoint_dir is not None:
        ckpt = Path(cfg.checkpoint_dir)
        if not ckpt.is_dir():
            raise MissingDirectoryError(f"checkpoint directory {ckpt} does not exist (create it first)")
        if not os.access(ckpt, os.W_OK | os.X_OK):
            raise StoragePermissionError(f"checkpoint directory {ckpt} is not writable")
    if profile is not None and profile.batch and (profile.batch, profile.seq) != (cfg.batch, cfg.seq):
        raise UsageError(f"the profile was recorded with --batch {profile.batch} --seq {profile.seq} but this run "
                         f"uses --batch {cfg.batch} --seq {cfg.seq}: the tensor order and activations differ; "
                         f"use the profile's values or re-run `tencache profile`")
    sources.batches(cfg.data, cfg.batch, cfg.seq, cfg.seed)  # a missing token file or loader, refused now
    if profile is not None and profile.model != cfg.model:
        raise ProfileError(f"the profile was recorded for model {profile.model!r}, not {cfg.model!r}: use its "
                           f"model or re-run `tencache profile`")
    if cfg.nvme_dir is None:
        return None
    if ranks is None:
        return NvmeRun.open(cfg.nvme_dir)
    if not Path(cfg.nvme_dir).is_dir():
        raise MissingDirectoryError(f"--nvme-dir {cfg.nvme_dir} does not exist on rank {ranks.rank} (create it first)")
    own = Path(cfg.nvme_dir) / f"rank{ranks.rank}"  # each rank its own locked share
    own.mkdir(exist_ok=True)
    return NvmeRun.open(own)


def build_engine(cfg: TrainConfig, profile: Profile | None = None, nvme_run: NvmeRun | None = None,
                 on_phase: Callable[[str], None] = lambda _: None,
                 progress: ProgressNote | None = None, ranks: RankGroup | None = None) -> OffloadEngine:
    """The model, its tiers and optimizer state for `cfg` (profiling first for tencache without a profile,
    loading the newest valid checkpoint with `resume`); `engine.adam_step` is the step to continue from.
    A preset is never materialised: built on the meta device, each tensor generated into its tier."""
    lazy = cfg.model in PRESETS
    device = pick_device(cfg.device)
    if ranks is not None and device.type == "cuda":
        device = torch.device("cuda", ranks.local_rank)  # torchrun: one GPU per rank on each machine
    model, masters = sources.build(cfg.model, cfg.seed, lazy=lazy)
    if cfg.policy == "tencache" and profile is None:
        on_phase("profiling")
        profile = run_profile(cfg, progress)
        release_freed_heap()  # the profiling model's tensors
    if not lazy:
        masters, _ = to_compute_dtype(model, torch.bfloat16, device)
    if profile is not None:
        profile.check_model(model, cfg.model)
    on_phase("populating tiers")
    budgets = Budgets(cfg.device_mem, cfg.cpu_mem, cfg.opt_mem, cfg.nvme_dir)
    engine = OffloadEngine(model, masters, policy=cfg.policy, budgets=budgets,
                           profile=profile if cfg.policy == "tencache" else None, hyper=_hyper(model, cfg),
                           device=device, nvme_run=nvme_run, accumulate=cfg.accumulate, clip_norm=cfg.clip, ranks=ranks,
                           progress=progress)
    del masters
    release_freed_heap()  # the model's own storage, now copied into the pools and the NVMe tier
    try:
        if cfg.resume:
            on_phase("loading checkpoint")
            resume(cfg, engine)
        check_space(engine, cfg)  # before training starts, not when the first checkpoint is due
    except BaseException:
        engine.close()
        raise
    return engine


def train(cfg: TrainConfig, profile: Profile | None = None, *, telemetry: Telemetry | None = None,
          on_step: Callable[[dict[str, Any]], None] | None = None,
          on_phase: Callable[[str], None] = lambda _: None, progress: ProgressNote | None = None) -> TrainResult:
    pin_mmap_threshold()  # freed weights and gradients go back to the kernel (see memory_accounting)
    # the runtime before any model or pool: interpreter, torch and what it imports on first use, allocator
    overhead = warm_up_runtime(lambda: run_profile(TrainConfig(model="gpt-tiny", batch=1, seq=8)))
    # under torchrun: this rank's share of the tensors and of each step's micro-batches (shards.py, ranks.py)
    ranks = RankGroup.from_env(pick_device(cfg.device).type, cfg.rank_timeout)
    try:
        nvme_run = preflight(cfg, profile, ranks)  # fail before the model is built, not when the first I/O is due
    except BaseException as exc:
        if ranks is not None:
            ranks.agree(exc, "the checks before training")  # the other ranks fail now too, naming this one
            ranks.close()
        raise
    try:
        if ranks is not None:
            ranks.agree(None, "the checks before training")
    except BaseException:
        if nvme_run is not None:
            nvme_run.close()
        ranks.close()
        raise
    try:
        engine = build_engine(cfg, profile, nvme_run, on_phase, progress, ranks)
        tel = telemetry or Telemetry(clock=RealClock())
        result = TrainResult(losses=[])
        data = sources.batches(cfg.data, cfg.batch, cfg.seq, cfg.seed)
        on_phase("training")
        try:
            for step in range(engine.adam_step, cfg.steps):
                record = one_step(engine, cfg, step, data)
                result.losses.append(record["loss"])
                result.steps.append(record)
                tel.event("step", **record)
                if on_step is not None:
                    on_step(record)
                if cfg.checkpoint_dir is not None and cfg.checkpoint_every and \
                        ((step + 1) % cfg.checkpoint_every == 0 or step + 1 == cfg.steps):
                    save_checkpoint(engine, cfg, step + 1, progress)  # every rank: each sends its own tensors
            if cfg.export is not None:
                on_phase("exporting")
                engine.export(Path(cfg.export))
            result.summary = summarize(result.steps, cfg, engine, overhead)
            tel.event("summary", **result.summary)
        finally:
            engine.close()
            if telemetry is None:
                tel.close()
    finally:
        if nvme_run is not None:
            nvme_run.close()  # this run's blocks go; checkpoints hold what --resume needs
        if ranks is not None:
            ranks.close()
    return result


def one_step(engine: OffloadEngine, cfg: TrainConfig, step: int, data: sources.Batches | None = None) -> dict[str, Any]:
    """One optimizer step (`cfg.accumulate` micro-batches; the loss is their mean) with its metrics (deltas
    of the engine's counters over this step)."""
    before_bytes = dict(engine.store.stats.bytes)
    before_alloc = engine.allocations()
    opt = engine.states.stats
    before_opt = (opt.accesses, opt.misses, opt.wait_s)
    data = data or sources.batches(cfg.data, cfg.batch, cfg.seq, cfg.seed)
    t0, c0 = time.perf_counter(), time.process_time()
    engine.hyper.groups[0]["lr"] = lr_at(cfg, step)
    engine.begin_step()
    micro = []
    ranks = engine.ranks
    first = step * cfg.accumulate * (ranks.world if ranks else 1) + (ranks.rank * cfg.accumulate if ranks else 0)
    for k in range(cfg.accumulate):
        x, y = data(first + k)
        loss = engine.model(x.to(engine.device), y.to(engine.device))
        engine.backward(loss)
        micro.append(loss.item())
    if ranks is not None:
        micro = ranks.gather(micro)  # the global batch's micro-batch losses, in the single process's order
    step_s = time.perf_counter() - t0
    cpu_s = time.process_time() - c0  # all threads of this process: comparable across a loaded machine
    s = engine.stats
    waits = sorted(s.fetch_waits)
    moved = {k: v - before_bytes.get(k, 0) for k, v in engine.store.stats.bytes.items()}
    accesses, misses = opt.accesses - before_opt[0], opt.misses - before_opt[1]
    return {"step": step, "loss": math.fsum(micro) / len(micro), "step_s": step_s, "cpu_s": cpu_s,
            "load_avg_1m": os.getloadavg()[0], "tokens_per_s": cfg.batch * cfg.seq * len(micro) / step_s,
            "device_hit_rate": s.device_hits / max(1, s.tensor_uses), "fetch_wait_s": s.fetch_wait_s,
            "fetch_wait_p99_s": waits[min(len(waits) - 1, math.ceil(0.99 * len(waits)) - 1)] if waits else 0.0,
            "bytes_moved": {k: v for k, v in sorted(moved.items()) if v}, "allocations": engine.allocations() - before_alloc,
            "optimizer_miss_rate": misses / max(1, accesses), "optimizer_wait_s": opt.wait_s - before_opt[2],
            "optimizer_s": s.optimizer_s, "deviations": s.deviations, "occupancy": engine.occupancy(),
            "activation_bytes": engine.tracker.saved_bytes, "rss": current_rss(), "peak_rss": peak_rss(),
            "gpu": engine.device_figures()}


def summarize(steps: list[dict[str, Any]], cfg: TrainConfig, engine: OffloadEngine,
              overhead: int | None = None) -> dict[str, Any]:
    """Means over the measured steps; with `overhead` (the runtime's RSS before the model), peak RSS against
    budgets + activations + overhead (memory_accounting.MemoryBound)."""
    measured = steps[cfg.warmup_steps:] if len(steps) > cfg.warmup_steps else steps
    n = len(measured)
    mean = lambda key: sum(r[key] for r in measured) / n  # noqa: E731
    moved: dict[str, float] = {}
    for r in measured:
        for k, v in r["bytes_moved"].items():
            moved[k] = moved.get(k, 0) + v / n
    occ = engine.occupancy()
    budgets, peak = cfg.device_mem + cfg.cpu_mem + cfg.opt_mem, max(r["peak_rss"] for r in steps)
    memory = {"budgets": budgets, "peak_rss": peak}
    if overhead is not None:
        memory = MemoryBound(budgets, max(r["activation_bytes"] for r in steps), overhead, peak).as_dict()
    gpu_keys = sorted({k for r in measured for k in r.get("gpu", {})})
    gpu = {k: statistics.fmean(r["gpu"][k] for r in measured if k in r.get("gpu", {})) for k in gpu_keys}
    return {"policy": cfg.policy, "model": cfg.model, "device": "emulated device" if engine.emulated else str(engine.device),
            "measured_steps": n, "step_s": mean("step_s"), "tokens_per_s": mean("tokens_per_s"),
            "step_s_median": statistics.median(r["step_s"] for r in measured),
            "cpu_s_median": statistics.median(r["cpu_s"] for r in measured),
            "load_avg_1m": mean("load_avg_1m"), "torch_threads": torch.get_num_threads(),  # intra-op, per thread
            "device_hit_rate": mean("device_hit_rate"), "fetch_wait_s": mean("fetch_wait_s"),
            "fetch_wait_p99_s": max(r["fetch_wait_p99_s"] for r in measured),
            "allocations_per_step": mean("allocations"), "optimizer_miss_rate": mean("optimizer_miss_rate"),
            "deviations_per_step": mean("deviations"), "bytes_moved_per_step": moved,
            "optimizer_wait_s": mean("optimizer_wait_s"), **memory,
            "device_utilisation": occ["device_pool_in_use"] / cfg.device_mem if cfg.device_mem else 0.0,
            "cpu_utilisation": occ["cpu_pool_in_use"] / cfg.cpu_mem if cfg.cpu_mem else 0.0,
            "optimizer_utilisation": occ["optimizer_capacity"] / cfg.opt_mem if cfg.opt_mem else 0.0,
            "occupancy": occ, "final_loss": steps[-1]["loss"] if steps else float("nan"),
            "gpu": gpu}  # NVML means over the measured steps (engine.device_figures); empty without a GPU
