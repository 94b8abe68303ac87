"""Sizing checks the engine makes before it takes any memory: what one module holds at once per size class,
and whether device and CPU slots leave room to swap through when there is no NVMe tier."""
from __future__ import annotations

from torch import nn

from mlsyskit.core.config import format_size
from mlsyskit.tools.offload.memory import round_up
from mlsyskit.tools.offload.pools import BudgetError
from mlsyskit.tools.offload.tiers import Entry
from mlsyskit.tools.offload.tracking import owning_modules


def concurrent_by_class(model: nn.Module, entries: list[Entry], only: set[int] | None = None) -> dict[int, int]:
    """Size class -> the most tensors of that class one module holds (all resident while it runs); with
    `only`, counting only those tensors (a rank's own, shards.py)."""
    most: dict[int, int] = {}
    for _, _, owned in owning_modules(model, {id(e.param): e for e in entries}):
        counts: dict[int, int] = {}
        for e in owned:
            if only is not None and e.idx not in only:
                continue
            n = e.nbytes
            counts[n] = counts.get(n, 0) + 1
        for n, c in counts.items():
            most[n] = max(most.get(n, 0), c)
    return most


def check_swap_room(distribution: dict[int, int], device_slots: dict[int, int], cpu_slots: dict[int, int]) -> None:
    """Without NVMe, a class that does not fit the device moves tensors between device and CPU, which needs
    one free slot of the class somewhere; device + CPU slots that hold the class exactly would deadlock."""
    short = [s for s, c in distribution.items()
             if device_slots.get(s, 0) < c and device_slots.get(s, 0) + cpu_slots.get(s, 0) <= c]
    if short:
        extra = sum(round_up(s) for s in short)
        raise BudgetError(f"without --nvme-dir, {len(short)} size class(es) (largest {format_size(max(short))}) fill "
                          f"the device and CPU slots exactly, leaving none free to swap through: raise the CPU "
                          f"budget by {format_size(extra)} or give --nvme-dir")
