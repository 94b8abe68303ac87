"""ZeRO-3 style ownership: which rank holds each tensor's compute copy and optimizer state.

Every parameter tensor is owned by exactly one rank, which keeps its compute copy in its own tiers
(device, CPU, NVMe under its own budgets and its own `--nvme-dir/rank<r>`) and its fp32 master, Adam
moments and gradient sum in its own optimizer-state cache; no other rank holds them between uses. The
partition balances bytes: tensors by decreasing cost (compute copy + 16 bytes of fp32 state per element
of a trainable tensor), each to the rank with the fewest bytes so far (ties: the lowest rank), a pure
function of the model, so every rank computes the same partition. The unit of ownership is a tensor: a
rank's share exceeds 1/N by at most the largest tensor's cost (`imbalance` measures it).

Each rank's 10Cache policy sees the profile restricted to its own tensors (`own_profile`): the same uses in
the same order (the engine's position in the profile is unchanged), each listing only the rank's tensors,
so prefetch and eviction follow the profiled order per rank.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from mlsyskit.tools.offload.profiler import Profile, Use

STATE_BYTES_PER_ELEMENT = 16  # fp32 master, m, v and the gradient sum


def tensor_cost(nbytes: int, numel: int, trainable: bool) -> int:
    """Bytes a rank holds for owning one tensor: its compute copy, and its fp32 state when trainable."""
    return nbytes + (STATE_BYTES_PER_ELEMENT * numel if trainable else 0)


def partition(costs: Mapping[int, int], world: int) -> dict[int, int]:
    """tensor idx -> owning rank: greedy by decreasing cost onto the least-loaded rank (deterministic)."""
    if world < 1:
        raise ValueError(f"world size must be >= 1, got {world}")
    load = [0] * world
    owner = {}
    for idx in sorted(costs, key=lambda i: (-costs[i], i)):
        r = min(range(world), key=lambda k: (load[k], k))
        owner[idx] = r
        load[r] += costs[idx]
    return owner


@dataclass(frozen=True)
class Shards:
    rank: int
    world: int
    owner: dict[int, int]  # tensor idx -> rank
    costs: dict[int, int]

    @classmethod
    def of(cls, costs: Mapping[int, int], rank: int, world: int) -> Shards:
        return cls(rank, world, partition(costs, world), dict(costs))

    def owns(self, idx: int) -> bool:
        return self.owner[idx] == self.rank

    def load(self, rank: int | None = None) -> int:
        r = self.rank if rank is None else rank
        return sum(c for i, c in self.costs.items() if self.owner[i] == r)

    @property
    def imbalance(self) -> float:
        """The largest rank's share over the even share 1/N (1.0: perfectly balanced)."""
        total = sum(self.costs.values())
        return max(self.load(r) for r in range(self.world)) * self.world / total if total else 1.0


def own_profile(profile: Profile, shards: Shards) -> Profile:
    """`profile` with every use listing only this rank's tensors (same uses, same order)."""
    return dataclasses.replace(
        profile, uses=[Use(u.module, u.phase, tuple(t for t in u.tensors if shards.owns(t))) for u in profile.uses],
        optimizer_order=[t for t in profile.optimizer_order if shards.owns(t)])
