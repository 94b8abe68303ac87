"""Host memory accounting: what a run may hold (budgets + activations + runtime overhead) against what it held.

The issue's bound for an offloaded run: peak RSS <= the sum of the budgets (device arena on the emulated
device, CPU parameter cache, optimizer-state cache) + the activations of one step (the storages autograd
saves for backward, measured by the use tracker) + the runtime's fixed overhead. The overhead is measured,
not assumed: the RSS once the interpreter, torch and its allocator are warmed up (a small forward and
backward on the intra-op thread pool), before any model tensor exists.

glibc keeps freed heap memory in its arenas: tensors below the mmap threshold come from the heap, and
glibc raises that threshold (up to 32 MiB) each time a large block is freed, so after the first freed
weight every tensor of a 350M model is a heap tensor whose pages stay resident when freed (measured:
gpt-125m peaked at 987 MiB by default, 796 MiB with the threshold pinned). `pin_mmap_threshold` fixes
the threshold at 1 MiB (tensors above it are mapped and unmapped; a few hundred page faults per step),
and `release_freed_heap` hands free heap pages back (malloc_trim) where a whole model was just freed.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import resource
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

_PAGE = os.sysconf("SC_PAGE_SIZE")


def current_rss() -> int:
    """This process's resident set size now, in bytes (Linux /proc)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE


def peak_rss() -> int:
    """The process's peak resident set size so far, in bytes. On Linux this is VmHWM, the high-water mark
    of this program's own memory: getrusage's ru_maxrss survives exec, so a run started from a large
    parent (pytest, a launcher) would report the parent's size at fork. The kernel folds the current RSS
    into the mark lazily, so the current RSS can be above it."""
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmHWM:"):
                    return max(int(line.split()[1]) * 1024, current_rss())
    except OSError:
        pass
    return max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, current_rss())


def _libc() -> Any:
    name = ctypes.util.find_library("c")
    try:
        lib = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    return lib if lib is not None and hasattr(lib, "malloc_trim") else None


_LIBC = _libc()


M_MMAP_THRESHOLD = -3  # glibc mallopt parameter
MMAP_THRESHOLD = 1 << 20


def pin_mmap_threshold(nbytes: int = MMAP_THRESHOLD) -> bool:
    """Serve allocations above `nbytes` by mmap and keep the threshold there (glibc's default raises it as
    large blocks are freed); process-wide. False where there is no glibc."""
    return _LIBC is not None and bool(_LIBC.mallopt(M_MMAP_THRESHOLD, nbytes))


def release_freed_heap() -> bool:
    """Return free heap pages to the kernel (glibc malloc_trim); False where there is no glibc."""
    if _LIBC is None:
        return False
    _LIBC.malloc_trim(0)
    return True


_exercised = False  # an exercise has run in this process: what it loads on first use is loaded


def warm_up_runtime(exercise: Callable[[], object] | None = None) -> int:
    """Pay torch's lazy start-up costs, then return the RSS: the run's fixed runtime overhead. A small
    forward and backward starts the intra-op threads and their allocator arenas; `exercise` (e.g. one
    step of a tiny model through the same code) imports what torch loads on first use (building a model on
    the meta device imports ~800 modules, 75 MiB, whatever the model's size). Those are paid once per
    process, so later runs in the same process (a library caller's, a test's) skip the exercise (0.2-0.3 CPU s)."""
    global _exercised
    x = torch.randn(64, 256, requires_grad=True)
    w = torch.randn(256, 256, dtype=torch.bfloat16, requires_grad=True)
    (x.to(torch.bfloat16) @ w).float().square().mean().backward()
    del x, w
    if exercise is not None and not _exercised:
        exercise()
        _exercised = True
    release_freed_heap()
    return current_rss()


@dataclass(frozen=True)
class MemoryBound:
    """Peak RSS against budgets + activations + overhead (the issue's target: ratio <= 1.3)."""

    budgets: int
    activations: int
    overhead: int
    peak: int

    @property
    def bound(self) -> int:
        return self.budgets + self.activations + self.overhead

    @property
    def ratio(self) -> float:
        return self.peak / self.bound if self.bound else float("inf")

    def as_dict(self) -> dict[str, Any]:
        return {"budgets": self.budgets, "activations": self.activations, "runtime_overhead_rss": self.overhead,
                "peak_rss": self.peak, "rss_bound": self.bound, "peak_rss_over_bound": self.ratio}
