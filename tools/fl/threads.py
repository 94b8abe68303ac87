"""Process settings for FL processes: one BLAS/torch thread, and no garbage collection of start-up objects.

FL matrices are tiny (a 64x64 MLP): a multithreaded BLAS spends more time waking and
synchronising its threads than multiplying, and on a loaded machine a 50 us product can take
tens of milliseconds. Ten clients on two cores also want one thread each.
"""
from __future__ import annotations

import gc
import sys

_wanted = {"single": False}  # single_threaded() was called: torch, when imported later, gets one thread too


def single_threaded() -> None:
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # ships with scikit-learn; without it we keep numpy's default
        pass
    else:
        threadpool_limits(1)
    _wanted["single"] = True
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(1)


def torch_imported(torch) -> None:
    """torch_model.py calls this once it has imported torch: commands import torch only when they first train,
    often after their single_threaded() (torch's default, a thread per core, spins on a loaded machine)."""
    if _wanted["single"]:
        torch.set_num_threads(1)


def pause_gc_for_startup() -> None:
    """Start-up (imports of torch, grpc, numpy; loading data) allocates ~170k long-lived objects and
    triggers full collections that cost ~0.4 s of CPU per process and free almost nothing."""
    gc.disable()


def freeze_startup_heap() -> None:
    """Once started, move everything allocated so far out of the collector's reach (gc.freeze), so
    the collections that rounds trigger scan only what rounds allocate; then collect as usual."""
    gc.freeze()
    gc.enable()
