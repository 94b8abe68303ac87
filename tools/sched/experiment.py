"""Run policies x seeds on one workload: what `marble sim` and the benchmark share."""
from __future__ import annotations

import csv
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mlsyskit.core.errors import UsageError
from mlsyskit.core.telemetry import Telemetry
from mlsyskit.tools.sched.cluster import ClusterSpec
from mlsyskit.tools.sched.metrics import aggregate, summarize, timing
from mlsyskit.tools.sched.policies import POLICIES, PolicyOptions, create_policy
from mlsyskit.tools.sched.policies.learned import DEFAULT_MODEL_ERROR, LearnedModel, PriorModel
from mlsyskit.tools.sched.simulator import SimResult, Simulator
from mlsyskit.tools.sched.state import JobSpec
from mlsyskit.tools.sched.throughput import ThroughputModel
from mlsyskit.tools.sched.workloads import (
    SyntheticSpec,
    WorkloadError,
    builtin_workload,
    load_philly,
    load_pollux,
    scale_to_load,
    synthetic,
)


def parse_policies(text: str) -> list[str]:
    """Comma-separated registered policy names, each once (UsageError otherwise)."""
    names = [p.strip() for p in text.split(",") if p.strip()]
    unknown = [p for p in names if p not in POLICIES]
    if not names or unknown:
        raise UsageError(f"unknown policy {', '.join(unknown) or '(none)'}; known: {', '.join(sorted(POLICIES))}")
    repeated = sorted({p for p in names if names.count(p) > 1})
    if repeated:
        raise UsageError(f"policy {', '.join(repeated)} given more than once; list each policy once")
    return names


@dataclass(frozen=True)
class WorkloadSource:
    """'workload-1'..'workload-4', 'philly' (the real 82,247-job trace), a Pollux or Philly CSV
    path (format from its header), any of these as NAME@LOAD (arrivals scaled so the offered load
    is LOAD, e.g. philly@0.8), or
    'synthetic:JOBS[@LOAD][/GPUS:WEIGHT,...][~heavy]' (the optional job-size mix, e.g.
    '/1:4,6:2,12:1', replaces the Pollux workloads' GPU counts; '~heavy' draws heavy-tailed
    GPU-hours instead of the Pollux size classes)."""

    text: str

    @property
    def label(self) -> str:
        return Path(self.text).stem if not self.text.startswith("synthetic") else self.text

    def load(self, model: ThroughputModel, seed: int, spec: ClusterSpec) -> list[JobSpec]:
        m = re.fullmatch(r"synthetic:(\d+)(?:@([0-9.eE+-]+))?(?:/(\d+:[0-9.]+(?:,\d+:[0-9.]+)*))?(~heavy)?", self.text)
        if m:
            mix = tuple((int(g), float(w)) for g, w in (p.split(":") for p in m.group(3).split(","))) \
                if m.group(3) else ()
            try:
                load = float(m.group(2) or 0.9)
            except ValueError:
                raise WorkloadError(f"synthetic workload: load must be a number, got {m.group(2)!r}") from None
            syn = SyntheticSpec(jobs=int(m.group(1)), load=load, size_mix=mix, heavy_tail=m.group(4) is not None)
            return synthetic(syn, model, seed, spec.total_gpus, spec.gpus_per_node)
        if self.text.startswith("synthetic"):
            raise WorkloadError("synthetic workloads look like synthetic:JOBS, synthetic:JOBS@LOAD or "
                                f"synthetic:JOBS@LOAD/GPUS:WEIGHT,...[~heavy] (e.g. synthetic:500@0.9/1:4,6:2~heavy), got {self.text!r}")
        scaled = re.fullmatch(r"(.+)@([0-9.]+)", self.text)
        if scaled and not builtin_workload(self.text).is_file():   # PATH@LOAD: arrivals scaled to LOAD
            jobs = WorkloadSource(scaled.group(1)).load(model, seed, spec)
            try:
                load = float(scaled.group(2))
            except ValueError:
                raise WorkloadError(f"load in {self.text!r} is not a number") from None
            return scale_to_load(jobs, load, model, spec.total_gpus, spec.gpus_per_node)
        path = builtin_workload(self.text)
        if not path.is_file():
            raise WorkloadError(f"workload not found: {self.text} (give a CSV path or workload-1..workload-4)")
        try:
            with path.open(newline="") as f:
                header = next(csv.reader(f), [])
        except (UnicodeDecodeError, csv.Error) as e:
            raise WorkloadError(f"{path}: not a text CSV file ({e})") from None
        if "application" in header:
            return load_pollux(path, model, seed, spec.gpus_per_node)
        if "num_gpus" in header:
            return load_philly(path, model, seed, spec.gpus_per_node)
        raise WorkloadError(f"{path}: header {','.join(header)} is neither Pollux "
                            "(name,time,application,num_replicas,batch_size) nor Philly "
                            "(timestamp,duration,num_gpus,gpu_time,cluster)")


@dataclass
class Run:
    policy: str
    seed: int
    result: SimResult
    summary: dict
    timing: dict


def run_one(source: WorkloadSource, spec: ClusterSpec, policy: str, seed: int, model: ThroughputModel,
            options: PolicyOptions, restart_cost: float, events_path: Path | None = None,
            on_finish: Callable[[int], None] | None = None, jobs: list[JobSpec] | None = None,
            model_error: float = DEFAULT_MODEL_ERROR) -> Run:
    """One replay. `model` is the ground truth, which only the simulator reads; the policy gets a
    `LearnedModel`: the applications' fitted scaling models off by `model_error` (mean relative
    error, seeded by `seed`), corrected by the throughput the replay measures; it sees jobs only
    as JobViews."""
    jobs = jobs if jobs is not None else source.load(model, seed, spec)
    learned = policy_model(model, model_error, seed)
    sim = Simulator(spec, create_policy(policy, learned, options), model, jobs, restart_cost=restart_cost,
                    on_finish=on_finish, seed=seed, samples=learned.samples)
    if events_path is not None:
        sim.telemetry = Telemetry(clock=sim.loop.clock, log_path=events_path, run_id=f"{policy}-seed{seed}")
    try:
        result = sim.run()
    finally:
        sim.telemetry.close()
    return Run(policy, seed, result, summarize(result, spec.total_gpus), timing(result))


def policy_model(truth: ThroughputModel, model_error: float = DEFAULT_MODEL_ERROR, seed: int = 0) -> LearnedModel:
    """What a policy knows about throughput in a replay of `truth` (policies.learned)."""
    return LearnedModel(PriorModel.of(truth, model_error, seed))


def report(runs: list[Run], source: WorkloadSource, spec: ClusterSpec, options: PolicyOptions,
           restart_cost: float, model_error: float = DEFAULT_MODEL_ERROR) -> dict:
    """The deterministic JSON document: per policy, every seed's summary and their mean."""
    policies: dict[str, dict] = {}
    for run in runs:
        entry = policies.setdefault(run.policy, {"seeds": {}})
        entry["seeds"][str(run.seed)] = run.summary
    for entry in policies.values():
        entry["mean"] = aggregate(list(entry["seeds"].values()))
    return {"workload": source.label, "cluster": str(spec), "restart_cost_s": restart_cost,
            "model_error": model_error,
            "options": {"efficiency_threshold": options.efficiency_threshold,
                        "pressure_threshold": options.pressure_threshold,
                        "backfill_depth": options.backfill_depth,
                        "tiresias_thresholds": list(options.tiresias_thresholds),
                        "optimus_interval": options.optimus_interval},
            "policies": policies}
