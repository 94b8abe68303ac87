"""Size-class pool sizing and initial placement (10Cache sections 4.2-4.3), as pure functions.

For a tier budget B and size classes s with counts c_s:
    share_s = s*c_s / sum(s*c_s);  slots_s = min(round(share_s * B / s), c_s)
Classes with one or two tensors get exactly that many slots (the paper's rule), and so do classes of
tensors of at most 64 KiB that all fit in 5% of the budget when `small_first` (ours; used for the
CPU parameter tier so tiny tensors never go to NVMe); every class gets at least one slot
(else a tensor of that size could never be used), or, with `min_slots`, as many as one module uses at
once (a module's tensors are all resident while it runs), and a budget that cannot hold that minimum
is rejected with the size it would need.

Placement walks the profiled use order: the first tensors that fit in free device slots of their
class form the active window, the next go to CPU slots, the rest to NVMe.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from mlsyskit.core.config import format_size
from mlsyskit.tools.offload.memory import round_up

SMALL_TENSOR = 64 * 1024  # bytes
SMALL_CLASS_SHARE = 0.05


class BudgetError(ValueError):
    """A budget too small for the tensors it must hold."""


def class_slots(distribution: Mapping[int, int], budget: int, *, tier: str, min_one: bool = True,
                stride: int = 4096, small_first: bool = False,
                min_slots: Mapping[int, int] | None = None) -> dict[int, int]:
    """Slots per size class for `budget` bytes (the formula above; slot memory is rounded to `stride`).
    `min_slots`: size class -> slots that must exist (tensors of that class one module uses at once)."""
    if not distribution:
        return {}
    floor = {s: max(1, min((min_slots or {}).get(s, 1), c)) if min_one else 0 for s, c in distribution.items()}
    slots: dict[int, int] = {}
    # ours (`small_first`, used for the CPU parameter tier): classes of tensors <= 64 KiB that all fit in 5% of
    # the budget get all their slots first; tiny tensors (biases, norms) cost an NVMe I/O each but almost no
    # memory, so they should never be sent to NVMe
    small_total = 0
    for s, c in sorted(distribution.items()) if small_first else ():
        need = round_up(s, stride) * c
        if s > SMALL_TENSOR or small_total + need > SMALL_CLASS_SHARE * budget:
            break
        slots[s] = c
        small_total += need
    rest = {s: c for s, c in distribution.items() if s not in slots}
    total = sum(s * c for s, c in rest.items())
    budget_rest = budget - small_total
    for s, c in sorted(rest.items()):
        if c <= 2 and round_up(s, stride) * c <= budget_rest:
            slots[s] = c
            continue
        n = min(round(s * c / total * budget_rest / s), c)
        slots[s] = max(n, floor[s])
    need = sum(round_up(s, stride) * n for s, n in floor.items())
    if need > budget:
        largest = max(distribution)
        what = ("one tensor of each size class needs" if all(n <= 1 for n in floor.values())
                else "the tensors one module uses at once (per size class) need")
        raise BudgetError(f"{tier} budget {format_size(budget)} is too small: {what} {format_size(need)} "
                          f"(the largest tensor is {format_size(largest)})")
    used = sum(round_up(s, stride) * n for s, n in slots.items())
    # rounding can overshoot the budget: take slots back from the classes that were rounded up most
    while used > budget:
        s = max((s for s, n in slots.items() if n > max(1, floor[s])), key=lambda s: round_up(s, stride),
                default=None)
        if s is None:
            break
        slots[s] -= 1
        used -= round_up(s, stride)
    return slots


def pool_bytes(slots: Mapping[int, int], stride: int = 4096) -> int:
    return sum(round_up(s, stride) * n for s, n in slots.items())


@dataclass(frozen=True)
class Placement:
    device: frozenset[int]
    cpu: frozenset[int]
    nvme: frozenset[int]

    def tier_of(self, idx: int) -> str:
        return "device" if idx in self.device else "cpu" if idx in self.cpu else "nvme"


def first_use_order(uses: Iterable[tuple[int, ...]], n_tensors: int) -> list[int]:
    """Tensor ids in order of first use (unused tensors last, by id)."""
    seen: dict[int, None] = {}
    for tensors in uses:
        for t in tensors:
            seen.setdefault(t, None)
    return list(seen) + [t for t in range(n_tensors) if t not in seen]


def place(order: Iterable[int], sizes: Mapping[int, int], device_slots: Mapping[int, int],
          cpu_slots: Mapping[int, int], *, device_fill: bool = True) -> Placement:
    """Fill device slots (when `device_fill`), then CPU slots, in `order`; the rest go to NVMe."""
    free_dev = dict(device_slots) if device_fill else {}
    free_cpu = dict(cpu_slots)
    dev, cpu, nvme = set(), set(), set()
    for t in order:
        s = sizes[t]
        if free_dev.get(s, 0) > 0:
            free_dev[s] -= 1
            dev.add(t)
        elif free_cpu.get(s, 0) > 0:
            free_cpu[s] -= 1
            cpu.add(t)
        else:
            nvme.add(t)
    return Placement(frozenset(dev), frozenset(cpu), frozenset(nvme))
