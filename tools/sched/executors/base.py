"""The executor interface: how the daemon starts, follows and stops a job on the cluster.

The daemon decides *where* (nodes and device ids, from the policy); an executor only carries it
out. One file per executor, registered by name (`local`, `slurm`; a Kubernetes or Ray executor
would be a third file), so policies and the daemon never change when one is added.

A launch is described by `Launch`; the executor returns a `handle` (a string the daemon stores)
and later answers `poll(launch, handle)` with a `Status`. After a daemon crash, a job the store
shows as `launching` (no handle yet) is handed to `recover(launch)`, which finds it if it started
(returns its handle) or proves it did not (returns None: the daemon queues it again).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from mlsyskit.core.registry import Registry

RUNNING, EXITED, GONE = "running", "exited", "gone"


@dataclass(frozen=True)
class NodeSlice:
    """The part of a job on one node: its name, Slurm host, the device ids held and computed on."""

    node: str
    host: str
    held: tuple[int, ...]
    visible: tuple[int, ...]   # CUDA_VISIBLE_DEVICES: the first `shape` of the held ids


@dataclass(frozen=True)
class Launch:
    job_id: int
    name: str
    cmd: str
    run_dir: Path                 # the executor's files for this job (log, pid, exit code)
    workdir: str
    env: dict[str, str]
    nodes: tuple[NodeSlice, ...]
    tag: str                      # unique per store and job, e.g. marble-<instance>-<id>

    @property
    def log_path(self) -> Path:
        return self.run_dir / "output.log"

    @property
    def visible(self) -> tuple[int, ...]:
        return tuple(d for s in self.nodes for d in s.visible)

    def job_env(self) -> dict[str, str]:
        """What every executor tells the job about its allocation."""
        return {**self.env, "MARBLE_JOB_ID": str(self.job_id), "MARBLE_JOB_NAME": self.name,
                "MARBLE_NODES": ",".join(s.node for s in self.nodes),
                "MARBLE_GPUS": str(len(self.visible)),
                "MARBLE_PLACEMENT": ";".join(f"{s.node}:{','.join(map(str, s.visible))}" for s in self.nodes),
                "MARBLE_PROGRESS": str(self.run_dir / "progress"),
                "CUDA_VISIBLE_DEVICES": ",".join(map(str, self.visible))}


@dataclass(frozen=True)
class Status:
    kind: str                     # RUNNING, EXITED (exit_code set) or GONE (reason set)
    exit_code: int | None = None
    reason: str = ""


class ExecutorError(RuntimeError):
    """The executor could not do what was asked (e.g. sbatch refused the job); the message says why."""


class Executor(ABC):
    name: ClassVar[str]
    one_machine: ClassVar[bool]   # all nodes are this machine (device ids must be distinct across nodes)
    # The daemon may preempt a job (stop its processes, queue it again, launch it anew later in a
    # fresh run directory): true where a second launch of one job is a new, independent run.
    restartable: ClassVar[bool] = False

    @abstractmethod
    def launch(self, launch: Launch) -> str:
        """Start the job; return its handle. Raise ExecutorError when it cannot start."""

    @abstractmethod
    def poll(self, launch: Launch, handle: str) -> Status:
        """Where the job is now."""

    @abstractmethod
    def recover(self, launch: Launch) -> str | None:
        """After a crash during launch: the handle if the job started, None if it provably did not."""

    @abstractmethod
    def cancel(self, launch: Launch, handle: str, force: bool) -> None:
        """Ask the job to stop (force: kill it outright); `poll` reports when it has."""


EXECUTORS: Registry[Executor] = Registry("executor")
