"""Executors behind one interface (base.py); importing this package registers them all."""
from mlsyskit.tools.sched.executors import local, slurm  # noqa: F401
from mlsyskit.tools.sched.executors.base import EXECUTORS, Executor, ExecutorError, Launch, NodeSlice, Status

__all__ = ["EXECUTORS", "Executor", "ExecutorError", "Launch", "NodeSlice", "Status"]
