"""What users hand the daemon: job specs (job.toml or flags) and the cluster (cluster.toml).

    # job.toml                              # cluster.toml
    name = "cifar-a"                        [[nodes]]
    cmd = "python train.py"                 name = "node0"
    app = "cifar10"                         gpus = 4
    gpus = 4                                host = "gpu-a"        # Slurm NodeName (default: name)
    min_gpus = 1        # optional          devices = [0, 1, 2, 3]  # CUDA ids (default: 0.. per machine)
    batch_size = 512    # optional          logical = true          # no physical GPUs behind the ids

Field errors name the field (`gpus: expected an integer`); unknown fields name the valid ones.
`app` must be an application the throughput model knows (the policy sizes jobs from it).
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from mlsyskit.core.config import ConfigError, from_dict, load_toml, require
from mlsyskit.tools.sched.cluster import ClusterSpec

MAX_NODES = 4096


@dataclass(frozen=True)
class JobRequest:
    cmd: str
    app: str
    gpus: int
    name: str = ""
    min_gpus: int = 1
    max_gpus: int = 0              # 0 -> gpus; the policy never gives more than this
    batch_size: int = 0            # 0 -> the app's usual batch (see default_batch)
    workdir: str = ""              # "" -> the daemon's working directory
    env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        require(bool(self.cmd.strip()), "cmd: must not be empty")
        require(1 <= self.gpus <= 4096, f"gpus: must be in 1..4096, got {self.gpus}")
        require(1 <= self.min_gpus <= self.gpus, f"min_gpus: must be in 1..gpus ({self.gpus}), got {self.min_gpus}")
        require(self.max_gpus == 0 or self.max_gpus >= self.gpus,
                f"max_gpus: must be >= gpus ({self.gpus}), got {self.max_gpus}")
        require(self.batch_size >= 0, f"batch_size: must be >= 0, got {self.batch_size}")
        require(len(self.name) <= 200 and "\n" not in self.name, "name: at most 200 characters, one line")
        for key in self.env:
            require(key.isidentifier() and not key.startswith(("MARBLE_", "CUDA_VISIBLE_DEVICES")),
                    f"env: {key!r} is not a variable a job may set (MARBLE_* and CUDA_VISIBLE_DEVICES are the daemon's)")

    @property
    def upper_gpus(self) -> int:
        return self.max_gpus or self.gpus

    @property
    def display_name(self) -> str:
        return self.name or self.cmd.split()[0].rsplit("/", 1)[-1][:40]

    def as_dict(self) -> dict[str, Any]:
        return {"cmd": self.cmd, "app": self.app, "gpus": self.gpus, "name": self.name, "min_gpus": self.min_gpus,
                "max_gpus": self.max_gpus, "batch_size": self.batch_size,
                "workdir": self.workdir, "env": dict(self.env)}


def job_from_mapping(data: dict[str, Any], known_apps: list[str] | None = None, where: str = "job") -> JobRequest:
    """Validate a job spec; every error names the field (and, for `app`, the known applications)."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: a job spec must be a table")
    try:
        job = from_dict(JobRequest, data)
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None
    if known_apps is not None and job.app not in known_apps:
        raise ConfigError(f"{where}: app: unknown application {job.app!r}; known: {', '.join(known_apps)}")
    return job


def load_job(path: str | Path, known_apps: list[str] | None = None) -> JobRequest:
    return job_from_mapping(load_toml(path), known_apps, where=str(path))


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
