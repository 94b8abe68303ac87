"""What users hand the daemon: job specs (job.toml or flags) and the cluster (cluster.toml).

    # job.toml                              # cluster.toml
    name = "cifar-a"                        [[nodes]]
    cmd = "python train.py"                 name = "node0"
    app = "cifar10"     # optional           gpus = 4
    gpus = 4                                host = "gpu-a"        # Slurm NodeName (default: name)
    min_gpus = 1        # optional          devices = [0, 1, 2, 3]  # CUDA ids (default: 0.. per machine)
    batch_size = 512    # optional          logical = true          # no physical GPUs behind the ids
    time = "1:30:00"    # optional wall-time limit (Slurm formats)
    dependency = "afterok:12"    # optional: start once job 12 (every task of array 12) is done
    nodes = 1           # optional: at most this many nodes

GPU counts are exact unless `min_gpus` (or `max_gpus`) opts into elasticity: `gpus = 8` runs on 8.

Field errors name the field (`gpus: expected an integer`); unknown fields name the valid ones.
`app` (optional) names an application the throughput model knows (`marble model`, or your own
from `marble profile --out` given to `serve --profiles`); the policy sizes elastic jobs from its
curve. A job without `app` is any program: it runs on exactly `gpus`, ranked and placed as if it
scaled linearly (`linear`); elasticity (`min_gpus`, `max_gpus`) needs an `app`.
"""
from __future__ import annotations

import functools
import math
import re
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from mlsyskit.core.config import ConfigError, from_dict, load_toml, require
from mlsyskit.tools.sched.cluster import ClusterSpec
from mlsyskit.tools.sched.profiles import LINEAR_APP

MAX_NODES = 4096
MAX_TIME_S = 365 * 86400           # a wall-time limit beyond a year is a typo, not a job
MAX_BATCH = 10_000_000             # global batch (samples per step)
_TIME = re.compile(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?")


def parse_time(text: str) -> float:
    """Slurm's --time formats -> seconds: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS
    ("" or "0" = no limit). Raises ValueError naming the formats."""
    text = text.strip()
    m = _TIME.fullmatch(text)
    if not text or text == "0":
        return 0.0
    if m is None:
        raise ValueError(f"time: {text!r} is not a wall time; use MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS")
    days, a, b, c = (int(g) if g else None for g in m.groups())
    if days is None:   # MM | MM:SS | HH:MM:SS
        parts = [p for p in (a, b, c) if p is not None]
        seconds = {1: lambda: parts[0] * 60, 2: lambda: parts[0] * 60 + parts[1],
                   3: lambda: parts[0] * 3600 + parts[1] * 60 + parts[2]}[len(parts)]()
    else:              # D-HH | D-HH:MM | D-HH:MM:SS
        seconds = days * 86400 + a * 3600 + (b or 0) * 60 + (c or 0)
    if seconds > MAX_TIME_S:
        raise ValueError(f"time: {text!r} is {seconds / 86400:,.0f} days; the limit is 365 days")
    return float(seconds)


def parse_dependency(text: str) -> tuple[int, ...]:
    """'afterok:12:13,afterok:14' -> (12, 13, 14). Only afterok (Slurm's most common type) is supported."""
    ids: list[int] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        kind, _, rest = part.partition(":")
        if kind != "afterok" or not rest:
            raise ValueError(f"dependency: {part!r}: use afterok:JOBID[:JOBID...] (the only dependency type supported)")
        for token in rest.split(":"):
            if not token.isdigit() or int(token) < 1:
                raise ValueError(f"dependency: {token!r} in {part!r} is not a job id")
            ids.append(int(token))
    return tuple(dict.fromkeys(ids))


def parse_array(text: str, limit: int = 1000) -> tuple[int, ...]:
    """Slurm's --array: '0-9', '1,3,5-7', '0-20:5' -> task ids (at most `limit`)."""
    tasks: list[int] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        m = re.fullmatch(r"(\d+)(?:-(\d+)(?::(\d+))?)?", part)
        if m is None:
            raise ValueError(f"array: {part!r} is not a task range; use e.g. 0-9, 1,3,5-7 or 0-20:5")
        lo, hi, step = int(m.group(1)), int(m.group(2) or m.group(1)), int(m.group(3) or 1)
        if hi < lo or step < 1:
            raise ValueError(f"array: {part!r} is an empty range")
        if (hi - lo) // step + 1 + len(tasks) > limit:
            raise ValueError(f"array: {text!r} has more than {limit} tasks")
        tasks.extend(range(lo, hi + 1, step))
    if not tasks:
        raise ValueError(f"array: {text!r} names no task")
    return tuple(sorted(set(tasks)))


@dataclass(frozen=True)
class JobRequest:
    cmd: str
    gpus: int
    app: str = ""                  # "" -> any program, sized as LINEAR_APP and never resized
    name: str = ""
    min_gpus: int = 0              # 0 -> gpus (exact); fewer opts into elasticity
    max_gpus: int = 0              # 0 -> gpus; the policy never gives more than this
    batch_size: int = 0            # 0 -> the app's usual batch (see default_batch)
    workdir: str = ""              # "" -> the daemon's working directory
    env: dict[str, str] = field(default_factory=dict)
    time: str = ""                 # wall-time limit (Slurm formats); "" -> none (or the daemon's default)
    dependency: str = ""           # "afterok:ID[:ID...]"
    nodes: int = 0                 # at most this many nodes; 0 -> any

    def __post_init__(self) -> None:
        require(bool(self.cmd.strip()), "cmd: must not be empty")
        require(1 <= self.gpus <= 4096, f"gpus: must be in 1..4096, got {self.gpus}")
        require(self.min_gpus == 0 or 1 <= self.min_gpus <= self.gpus,
                f"min_gpus: must be in 1..gpus ({self.gpus}), got {self.min_gpus}")
        require(self.max_gpus == 0 or self.gpus <= self.max_gpus <= 4096,
                f"max_gpus: must be in gpus ({self.gpus})..4096, got {self.max_gpus}")
        require(bool(self.app) or self.min_gpus in (0, self.gpus) and self.max_gpus in (0, self.gpus),
                "min_gpus/max_gpus: an elastic job needs `app` (--app): the policy sizes it from that "
                "application's measured curve (`marble model` lists them; `marble profile` measures your own)")
        require(0 <= self.batch_size <= MAX_BATCH,
                f"batch_size: must be in 1..{MAX_BATCH:,} samples (0 = the app's usual), got {self.batch_size:,}")
        require(0 <= self.nodes <= MAX_NODES, f"nodes: must be in 1..{MAX_NODES} (0 = any), got {self.nodes}")
        for parse, text in ((parse_time, self.time), (parse_dependency, self.dependency)):
            try:
                parse(text)
            except ValueError as e:
                raise ConfigError(str(e)) from None
        require(len(self.name) <= 200 and "\n" not in self.name, "name: at most 200 characters, one line")
        for key in self.env:
            require(key.isidentifier() and not key.startswith(("MARBLE_", "CUDA_VISIBLE_DEVICES")),
                    f"env: {key!r} is not a variable a job may set (MARBLE_* and CUDA_VISIBLE_DEVICES are the daemon's)")

    @property
    def model_app(self) -> str:
        """The application the policy sizes this job by."""
        return self.app or LINEAR_APP

    @property
    def upper_gpus(self) -> int:
        return self.max_gpus or self.gpus

    @property
    def lower_gpus(self) -> int:
        return self.min_gpus or self.gpus

    @functools.cached_property
    def time_limit_s(self) -> float:
        return parse_time(self.time)

    @functools.cached_property
    def after_ok(self) -> tuple[int, ...]:
        return parse_dependency(self.dependency) if self.dependency else ()

    @property
    def display_name(self) -> str:
        return self.name or self.cmd.split()[0].rsplit("/", 1)[-1][:40]

    def as_dict(self) -> dict[str, Any]:
        return {"cmd": self.cmd, "app": self.app, "gpus": self.gpus, "name": self.name, "min_gpus": self.min_gpus,
                "max_gpus": self.max_gpus, "batch_size": self.batch_size,
                "workdir": self.workdir, "env": dict(self.env), "time": self.time, "dependency": self.dependency,
                "nodes": self.nodes}


def job_from_mapping(data: dict[str, Any], known_apps: list[str] | None = None, where: str = "job") -> JobRequest:
    """Validate a job spec; every error names the field (and, for `app`, the known applications)."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: a job spec must be a table")
    for key in ("gpus", "min_gpus", "max_gpus", "nodes"):
        value = data.get(key)
        if isinstance(value, float) and not isinstance(value, bool):
            raise ConfigError(f"{where}: {key}: GPUs and nodes are whole numbers, got {value!r} "
                              "(fractional GPUs are not supported)")
    batch = data.get("batch_size")
    if isinstance(batch, float) and math.isfinite(batch) and batch.is_integer() and 0 <= batch <= MAX_BATCH:
        data = {**data, "batch_size": int(batch)}
    elif isinstance(batch, float):
        raise ConfigError(f"{where}: batch_size: a whole number of samples in 1..{MAX_BATCH:,} expected, got {batch!r}")
    try:
        job = from_dict(JobRequest, data)
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None
    if known_apps is not None and job.app and job.app not in known_apps:
        raise ConfigError(f"{where}: app: unknown application {job.app!r}; known: {', '.join(known_apps)}")
    return job


def read_job_file(path: str | Path) -> dict[str, Any]:
    """A job.toml as a table; any problem (missing, not UTF-8, not TOML, not a table) is one ConfigError line."""
    try:
        raw = Path(path).read_bytes()
    except OSError as e:
        raise ConfigError(f"{path}: cannot read the job file: {e.strerror}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not a UTF-8 text file (byte {e.start}: {raw[e.start:e.start + 1]!r}); "
                          "a job file is TOML") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: invalid TOML: {e}") from None


def load_job(path: str | Path, known_apps: list[str] | None = None) -> JobRequest:
    return job_from_mapping(read_job_file(path), known_apps, where=str(path))


@dataclass(frozen=True)
class NodeConfig:
    name: str
    gpus: int
    host: str = ""                       # Slurm NodeName; "" -> name
    devices: tuple[int, ...] = ()         # CUDA device ids; () -> see ClusterConfig.devices
    logical: bool = False                 # no physical GPUs: ids are slots, for machines without GPUs

    def __post_init__(self) -> None:
        require(bool(self.name.strip()), "name: must not be empty")
        require(1 <= self.gpus <= 64, f"gpus: must be in 1..64, got {self.gpus}")
        require(not self.devices or len(self.devices) == self.gpus,
                f"devices: lists {len(self.devices)} ids for {self.gpus} GPUs")
        require(len(set(self.devices)) == len(self.devices), "devices: ids repeat")

    @property
    def slurm_host(self) -> str:
        return self.host or self.name


@dataclass(frozen=True)
class ClusterConfig:
    nodes: tuple[NodeConfig, ...]

    def __post_init__(self) -> None:
        require(1 <= len(self.nodes) <= MAX_NODES, f"nodes: need 1..{MAX_NODES} nodes, got {len(self.nodes)}")
        names = [n.name for n in self.nodes]
        require(len(set(names)) == len(names), "nodes: node names repeat")

    @property
    def gpus_per_node(self) -> int:
        """The largest node's GPU count (nodes may differ: placement honours each node's own)."""
        return max(n.gpus for n in self.nodes)

    @property
    def total_gpus(self) -> int:
        return sum(n.gpus for n in self.nodes)

    def spec(self) -> ClusterSpec:
        """The policies' view: per-node GPU counts in the order of `nodes`."""
        return ClusterSpec.of_nodes([n.gpus for n in self.nodes])

    def devices(self, node: int, one_machine: bool) -> tuple[int, ...]:
        """CUDA ids of `node`: its own list; else 0..gpus-1, or, when every node lives on this one
        machine (local executor), distinct ids across nodes so no two jobs ever see the same id."""
        spec = self.nodes[node]
        if spec.devices:
            return spec.devices
        base = sum(n.gpus for n in self.nodes[:node]) if one_machine else 0
        return tuple(range(base, base + spec.gpus))


def load_cluster(path: str | Path) -> ClusterConfig:
    raw = load_toml(path)
    valid = {f.name for f in fields(NodeConfig)}
    for i, node in enumerate(raw.get("nodes", []) if isinstance(raw.get("nodes"), list) else []):
        unknown = sorted(set(node) - valid) if isinstance(node, dict) else []
        if unknown:  # core's check does not look inside lists of tables
            raise ConfigError(f"{path}: nodes[{i}]: unknown key {unknown[0]!r}; valid keys: {', '.join(sorted(valid))}")
    try:
        return from_dict(ClusterConfig, raw)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
