"""Executors behind one interface (base.py), registered here by their `name`: one file per
executor plus one entry in the tuple below (a Kubernetes or Ray executor fits the same way)."""
from mlsyskit.tools.sched.executors.base import EXECUTORS, Executor, ExecutorError, Launch, NodeSlice, Status
from mlsyskit.tools.sched.executors.local import LocalExecutor
from mlsyskit.tools.sched.executors.slurm import SlurmExecutor

for _cls in (LocalExecutor, SlurmExecutor):
    EXECUTORS.add(_cls)

__all__ = ["EXECUTORS", "Executor", "ExecutorError", "Launch", "NodeSlice", "Status"]
