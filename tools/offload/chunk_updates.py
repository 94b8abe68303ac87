"""The engine's per-tensor optimizer work, done chunk by chunk over the optimizer-state cache (chunks.py).

`accumulate_and_step` runs on the optimizer worker as a gradient arrives: each chunk's fp32 state is made
resident (`states.get(idx, j)`), the staged gradient's slice is added into the chunk's fp32 gradient, and on
the last backward pass the chunk's squared norm is taken and (without clipping) the AdamW step runs and the
new master is cast into the same slice of the staging buffer; then the chunk is handed back
(`states.put`), which lets the cache write it back and read the next NVMe-homed chunk ahead. `clip_update`
is the second sweep after the global norm. Per element, the arithmetic is exactly the whole-tensor one.
"""
from __future__ import annotations

import math
from collections.abc import Callable

import torch

from mlsyskit.tools.offload.optimizer import AdamConfig, NonFiniteError, OptimizerStateCache, adam_update


def accumulate_and_step(states: OptimizerStateCache, idx: int, grad: torch.Tensor, *, first: bool, last: bool,
                        step: int | None, cfg: AdamConfig | None, what: str = "") -> float | None:
    """Add `grad` (flat, compute dtype, the whole tensor) into idx's fp32 gradient (copy on the first pass);
    on the `last` pass return the squared L2 norm (a non-finite chunk raises NonFiniteError naming `what`
    before that chunk is updated); with `step` (the tensor's new Adam step) run AdamW and leave the new
    master weight, cast to grad's dtype, in `grad` itself."""
    parts = []
    for j, (lo, hi) in enumerate(states.chunks(idx)):
        master, m, v, g32 = states.get(idx, j)
        g = grad[lo:hi]
        if first:
            g32.copy_(g)  # compute dtype -> fp32
        else:
            g32.add_(g)
        if last:
            parts.append(float(torch.dot(g32, g32)))
            if not math.isfinite(parts[-1]):
                states.put(idx, j)
                raise NonFiniteError(f"the gradient of {what or idx} is not finite")
        if step is not None:
            adam_update(master, g32, m, v, step, cfg)
            g.copy_(master)  # fp32 -> compute dtype, as the copy into the tier did
        states.put(idx, j)
    return (parts[0] if len(parts) == 1 else math.fsum(parts)) if last else None


def clip_update(states: OptimizerStateCache, idx: int, coef: float, step: int, cfg: AdamConfig,
                write: Callable[[int, torch.Tensor, torch.Tensor], None]) -> None:
    """Scale idx's fp32 gradient by `coef` (unless 1) and run AdamW, chunk by chunk; `write(lo, master,
    scratch)` stores each chunk's new master as the compute copy of elements [lo, lo + len(master))
    (`scratch`, the chunk's gradient, is free memory of the same size for staging a cast)."""
    for j, (lo, _hi) in enumerate(states.chunks(idx)):
        master, m, v, g32 = states.get(idx, j)
        if coef != 1.0:
            g32.mul_(coef)
        adam_update(master, g32, m, v, step, cfg)
        write(lo, master, g32)
        states.put(idx, j)
