"""Workloads: Pollux-style CSVs, Philly-style job logs and a synthetic Poisson generator.

None of the inputs says how much *work* a job is (Pollux's traces end jobs at a target accuracy;
Philly logs give wall time on the requested GPUs). marble's rule ("Job work" in docs/marble.md):
a job's size is its GPU-hours when run as asked (requested GPUs, compact layout); work (samples)
= that wall time x the model's throughput on that layout. Pollux jobs draw GPU-hours log-uniformly
within their application's size class from the Pollux paper (S 0.1-1, M 1-10, L 10-100,
XL 100-1000), seeded per job name; Philly jobs use their logged duration.
"""
from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from mlsyskit.core.errors import UsageError
from mlsyskit.core.sim import Seeds, sub_seed
from mlsyskit.tools.sched.profiles import DATA_DIR
from mlsyskit.tools.sched.state import JobSpec
from mlsyskit.tools.sched.throughput import ThroughputModel, compact_shape

WORKLOADS_DIR = DATA_DIR / "pollux-workloads"
SIZE_CLASSES = {"S": (0.1, 1.0), "M": (1.0, 10.0), "L": (10.0, 100.0), "XL": (100.0, 1000.0)}
APP_CLASS = {"cifar10": "S", "ncf": "S", "deepspeech2": "M", "bert": "M", "yolov3": "L", "imagenet": "XL"}
CLASS_APPS = {c: sorted(a for a, k in APP_CLASS.items() if k == c) for c in SIZE_CLASSES}
# Global batch sizes the Pollux workloads use per application (Philly/synthetic jobs pick one).
APP_BATCHES = {"bert": (384,), "cifar10": (2048, 4096), "deepspeech2": (320, 640), "imagenet": (3200, 6400),
               "ncf": (32768,), "yolov3": (64,)}


# Arrival times (seconds from the trace's start) beyond this would lose sub-second resolution in
# float64 sums and are not a real trace (about 31 years).
MAX_ARRIVAL_S = 1e9


# Bounds beyond which a field is a typo, not a job: a global batch of 10 million samples, a job
# of 10 years, 100,000 GPUs; a synthetic load below 0.001 spaces jobs years apart.
MAX_BATCH = 10_000_000
MAX_DURATION_S = 10 * 365 * 86400.0
MAX_GPUS = 100_000
MIN_LOAD = 1e-3


class WorkloadError(UsageError, ValueError):
    """A workload file that cannot be read as the documented format (a usage error: exit 2)."""


def whole(field: str, text: str, low: int, high: int) -> int:
    """`text` as a whole number in [low, high], or ValueError naming `field` (fractional GPUs too)."""
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{field} must be a whole number, got {text!r}") from None
    if not value.is_integer():
        raise ValueError(f"{field} must be a whole number, got {text!r} (fractional GPUs or samples are not a thing)")
    if not low <= value <= high:
        raise ValueError(f"{field} must be in [{low:,}, {high:,}], got {text!r}")
    return int(value)


def _unique_names(path: Path, names: list[str]) -> None:
    seen: dict[str, int] = {}
    for i, name in enumerate(names):
        if name in seen:
            raise WorkloadError(f"{path}: line {i + 2}: job name {name!r} repeats line {seen[name] + 2}; "
                                "job names must be unique")
        seen[name] = i


def parse_timestamp(text: str) -> float:
    """Seconds: a number, or a date-time as Philly logs it ('2017-10-03 14:05:00', UTC when no
    zone is given; ISO 8601 'T' form accepted too)."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        stamp = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"timestamp {text!r} is neither seconds nor YYYY-MM-DD HH:MM:SS") from None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=UTC)
    return stamp.timestamp()


PHILLY = DATA_DIR / "philly" / "philly.csv"


def builtin_workload(name: str) -> Path:
    """'workload-1' .. 'workload-4' (the Pollux workloads shipped with marble), 'philly' (the
    82,247-job Microsoft Philly trace, data/PROVENANCE.md) or a path."""
    if name == "philly":
        return PHILLY
    path = WORKLOADS_DIR / f"{name}.csv"
    return path if path.exists() else Path(name)


def scale_to_load(jobs: list[JobSpec], load: float, model: ThroughputModel, total_gpus: int,
                  gpus_per_node: int) -> list[JobSpec]:
    """The same jobs with arrival times stretched or squeezed (one factor for all) so the offered
    load is `load`: the jobs' GPU-seconds as asked (work / rate on the requested GPUs, compact)
    over the arrival span equals `load` x the cluster's GPUs."""
    if not (math.isfinite(load) and 0 < load <= 10):
        raise WorkloadError(f"load must be in (0, 10], got {load}")
    t0 = min(j.arrival for j in jobs)
    span = max(j.arrival for j in jobs) - t0
    if span <= 0:
        raise WorkloadError("a load needs jobs that arrive at different times")
    offered = sum(j.gpus * j.work / model.rate(j.app, compact_shape(j.gpus, gpus_per_node), j.batch_size)
                  for j in jobs)
    factor = offered / (load * total_gpus) / span
    return [JobSpec(j.job_id, j.name, j.app, (j.arrival - t0) * factor, j.gpus, j.batch_size, j.work) for j in jobs]


def work_for(model: ThroughputModel, app: str, gpus: int, batch: int, duration: float, gpus_per_node: int) -> float:
    return duration * model.rate(app, compact_shape(gpus, gpus_per_node), batch)


def _read_rows(path: Path, columns: tuple[str, ...]) -> list[dict[str, str]]:
    if not path.is_file():
        raise WorkloadError(f"workload file not found: {path}")
    try:
        with path.open(newline="") as f:
            reader = csv.DictReader(f)
            missing = [c for c in columns if c not in (reader.fieldnames or [])]
            if missing:
                raise WorkloadError(f"{path}: missing column(s) {', '.join(missing)}; expected {','.join(columns)}")
            rows = list(reader)
    except (UnicodeDecodeError, csv.Error) as e:
        raise WorkloadError(f"{path}: not a text CSV file ({e})") from None
    if not rows:
        raise WorkloadError(f"{path}: no jobs")
    for i, r in enumerate(rows):
        if None in r.values():  # DictReader fills a short row's missing fields with None
            raise WorkloadError(f"{path}: line {i + 2}: fewer fields than the header's {len(reader.fieldnames)}")
    return rows


def load_pollux(path: Path, model: ThroughputModel, seed: int, gpus_per_node: int) -> list[JobSpec]:
    """Columns name,time,application,num_replicas,batch_size."""
    rows = _read_rows(path, ("name", "time", "application", "num_replicas", "batch_size"))
    _unique_names(path, [r["name"] for r in rows])
    jobs = []
    for i, r in enumerate(rows):
        try:
            app = r["application"]
            gpus = whole("num_replicas", r["num_replicas"], 1, MAX_GPUS)
            batch = whole("batch_size", r["batch_size"], 1, MAX_BATCH)
            try:
                arrival = float(r["time"])
            except ValueError:
                raise ValueError(f"time must be a number of seconds, got {r['time']!r}") from None
            if not 0 <= arrival <= MAX_ARRIVAL_S:
                raise ValueError(f"time must be in [0, {MAX_ARRIVAL_S:.0e}] seconds, got {r['time']!r}")
        except ValueError as e:
            raise WorkloadError(f"{path}: line {i + 2}: {e}") from None
        if app not in APP_CLASS:
            raise WorkloadError(f"{path}: line {i + 2}: unknown application {app!r}")
        lo, hi = SIZE_CLASSES[APP_CLASS[app]]
        rng = Seeds(sub_seed(seed, "pollux-work")).random(r["name"])
        gpu_hours = math.exp(rng.uniform(math.log(lo), math.log(hi)))
        duration = gpu_hours * 3600.0 / gpus
        jobs.append(JobSpec(i, r["name"], app, arrival, gpus, batch,
                            work_for(model, app, gpus, batch, duration, gpus_per_node)))
    return jobs


def load_philly(path: Path, model: ThroughputModel, seed: int, gpus_per_node: int) -> list[JobSpec]:
    """Columns timestamp,duration,num_gpus,gpu_time,cluster (seconds). Each job is mapped to an
    application by its size class (GPU-hours = gpu_time / 3600, else duration x num_gpus), chosen
    uniformly within the class, and to one of that application's batch sizes, with an RNG seeded
    by (seed, row index): the same file and seed always give the same mapping."""
    rows = _read_rows(path, ("timestamp", "duration", "num_gpus", "gpu_time", "cluster"))
    jobs = []
    t0 = None
    for i, r in enumerate(rows):
        try:
            ts, duration = parse_timestamp(r["timestamp"]), float(r["duration"])
            gpus = whole("num_gpus", r["num_gpus"], 0, MAX_GPUS)
            gpu_time = float(r["gpu_time"]) if r["gpu_time"] else duration * gpus
            if duration > MAX_DURATION_S:
                raise ValueError(f"duration must be at most {MAX_DURATION_S:.2g} seconds (10 years), got {r['duration']!r}")
        except ValueError as e:
            raise WorkloadError(f"{path}: line {i + 2}: {e}") from None
        if not all(math.isfinite(v) for v in (ts, duration, gpu_time)) or gpu_time < 0:
            raise WorkloadError(f"{path}: line {i + 2}: timestamp, duration and gpu_time must be finite "
                                "(gpu_time >= 0)")
        if gpus < 1 or duration <= 0:
            continue  # CPU-only or failed-at-launch entries carry no GPU work
        t0 = ts if t0 is None else min(t0, ts)
        rng = Seeds(sub_seed(seed, "philly-map")).random(str(i))
        hours = gpu_time / 3600.0
        size = "S" if hours < 1 else "M" if hours < 10 else "L" if hours < 100 else "XL"
        app = rng.choice(CLASS_APPS[size])
        batch = rng.choice(APP_BATCHES[app])
        jobs.append(JobSpec(i, f"philly-{i}", app, ts, gpus, batch,
                            work_for(model, app, gpus, batch, duration, gpus_per_node)))
    if not jobs:
        raise WorkloadError(f"{path}: no GPU jobs")
    late = next((j for j in jobs if j.arrival - t0 > MAX_ARRIVAL_S), None)
    if late is not None:
        raise WorkloadError(f"{path}: line {late.job_id + 2}: arrives {late.arrival - t0:.3g} s after the first job; "
                            f"the limit is {MAX_ARRIVAL_S:.0e} s")
    return [JobSpec(j.job_id, j.name, j.app, j.arrival - t0, j.gpus, j.batch_size, j.work) for j in jobs]


HEAVY_MAX_GPU_HOURS = 5000.0


@dataclass(frozen=True)
class SyntheticSpec:
    jobs: int = 1000
    load: float = 0.9              # offered GPU-seconds per second / cluster GPUs
    size_mix: tuple[tuple[int, float], ...] = ()  # (GPUs, weight); empty = the Pollux workloads' mix
    heavy_tail: bool = False       # GPU-hours log-normal (median 0.3, sigma 2) instead of the size classes

    def __post_init__(self) -> None:
        if not 1 <= self.jobs <= 10_000_000:
            raise WorkloadError(f"synthetic workload: jobs must be in [1, 10,000,000], got {self.jobs}")
        if not (math.isfinite(self.load) and MIN_LOAD <= self.load <= 10):
            raise WorkloadError(f"synthetic workload: load must be in [{MIN_LOAD}, 10] (offered GPU-seconds per "
                                f"second over the cluster's GPUs), got {self.load:g}")
        if any(g < 1 or not 0 <= w < math.inf for g, w in self.size_mix) or \
                (self.size_mix and sum(w for _, w in self.size_mix) <= 0):
            raise WorkloadError("a synthetic size mix needs GPUs >= 1 and finite weights >= 0, not all 0")


def pollux_mix() -> list[tuple[str, int, int]]:
    """(application, GPUs, batch) of every job in the four shipped Pollux workloads."""
    out = []
    for n in range(1, 5):
        for r in _read_rows(WORKLOADS_DIR / f"workload-{n}.csv", ("application", "num_replicas", "batch_size")):
            out.append((r["application"], int(r["num_replicas"]), int(r["batch_size"])))
    return out


def synthetic(spec: SyntheticSpec, model: ThroughputModel, seed: int, total_gpus: int,
              gpus_per_node: int) -> list[JobSpec]:
    """Poisson arrivals; (application, GPUs, batch) drawn from the Pollux mix (GPUs from `size_mix`
    if given); GPU-hours log-uniform in the application's size class; the arrival rate is set so
    the offered load is `spec.load` of the cluster."""
    seeds = Seeds(seed)
    pick, size_rng, work_rng, arrive_rng = (seeds.random(n) for n in ("mix", "size", "work", "arrivals"))
    mix = pollux_mix()
    sizes, weights = zip(*spec.size_mix, strict=True) if spec.size_mix else ((), ())
    drafts = []
    for i in range(spec.jobs):
        app, gpus, batch = mix[pick.randrange(len(mix))]
        if sizes:
            gpus = size_rng.choices(sizes, weights)[0]
        gpus = min(gpus, total_gpus)
        if spec.heavy_tail:   # Philly-like: most jobs short, a few run for days
            gpu_hours = min(HEAVY_MAX_GPU_HOURS, max(0.005, math.exp(work_rng.gauss(math.log(0.3), 2.0))))
        else:
            lo, hi = SIZE_CLASSES[APP_CLASS[app]]
            gpu_hours = math.exp(work_rng.uniform(math.log(lo), math.log(hi)))
        gpu_seconds = gpu_hours * 3600.0
        drafts.append((i, app, gpus, batch, gpu_seconds))
    rate = spec.load * total_gpus / (sum(d[4] for d in drafts) / len(drafts))  # jobs per second
    t = 0.0
    jobs = []
    for i, app, gpus, batch, gpu_seconds in drafts:
        t += arrive_rng.expovariate(rate)
        jobs.append(JobSpec(i, f"syn-{i}", app, round(t, 3), gpus, batch,
                            work_for(model, app, gpus, batch, gpu_seconds / gpus, gpus_per_node)))
    return jobs
