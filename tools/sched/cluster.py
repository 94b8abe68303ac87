"""Cluster shape and per-node free GPUs.

`FreeMap` keeps, besides the free count of every node, one bucket per free count (an insertion
ordered dict used as an ordered set), so best-fit ("the node with the fewest free GPUs that still
fits") and "any wholly free node" are O(GPUs per node) instead of a scan over all nodes.
Policies never mutate the simulator's FreeMap: they plan on `copy()`.
"""
from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from mlsyskit.core.config import require

Placement = tuple[tuple[int, int], ...]  # ((node, gpus), ...)
MAX_NODES = 100_000   # per-node state is held in lists; more is not a cluster this tool simulates


@dataclass(frozen=True)
class ClusterSpec:
    nodes: int
    gpus_per_node: int

    def __post_init__(self) -> None:
        require(1 <= self.nodes <= MAX_NODES, f"a cluster has 1..{MAX_NODES:,} nodes, got {self.nodes:,}")
        require(1 <= self.gpus_per_node <= 64, f"gpus per node must be in 1..64, got {self.gpus_per_node}")

    @property
    def total_gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @classmethod
    def parse(cls, text: str) -> ClusterSpec:
        """'16x6' = 16 nodes with 6 GPUs each."""
        m = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", text)
        if not m:
            raise ValueError(f"cluster must look like NODESxGPUS (e.g. 16x6), got {text!r}")
        return cls(int(m.group(1)), int(m.group(2)))

    def __str__(self) -> str:
        return f"{self.nodes}x{self.gpus_per_node}"


class FreeMap:
    def __init__(self, spec: ClusterSpec) -> None:
        self.spec = spec
        self.free = [spec.gpus_per_node] * spec.nodes
        self.buckets: list[dict[int, None]] = [{} for _ in range(spec.gpus_per_node + 1)]
        self.buckets[spec.gpus_per_node] = dict.fromkeys(range(spec.nodes))
        self.total = spec.total_gpus

    def copy(self) -> FreeMap:
        other = FreeMap.__new__(FreeMap)
        other.spec = self.spec
        other.free = self.free.copy()
        other.buckets = [b.copy() for b in self.buckets]
        other.total = self.total
        return other

    def _move(self, node: int, new_free: int) -> None:
        old = self.free[node]
        if not 0 <= new_free <= self.spec.gpus_per_node:
            raise ValueError(f"node {node} would have {new_free} free GPUs (of {self.spec.gpus_per_node})")
        del self.buckets[old][node]
        self.buckets[new_free][node] = None
        self.free[node] = new_free
        self.total += new_free - old

    def take(self, placement: Placement) -> None:
        for node, gpus in placement:
            if gpus > self.free[node]:
                raise ValueError(f"node {node} has {self.free[node]} free GPUs, {gpus} requested")
            self._move(node, self.free[node] - gpus)

    def give(self, placement: Placement) -> None:
        for node, gpus in placement:
            self._move(node, self.free[node] + gpus)

    def max_free(self) -> int:
        """The most free GPUs on any one node."""
        for f in range(self.spec.gpus_per_node, 0, -1):
            if self.buckets[f]:
                return f
        return 0

    def whole_free_nodes(self) -> int:
        return len(self.buckets[self.spec.gpus_per_node])

    def _pick(self, need: int, used: set[int], best_fit: bool) -> int | None:
        g = self.spec.gpus_per_node
        counts = range(need, g + 1) if best_fit else range(g, need - 1, -1)
        for f in counts:
            for node in self.buckets[f]:
                if node not in used:
                    return node
        return None

    def fit(self, shape: Iterable[int], best_fit: bool = True) -> Placement | None:
        """Distinct nodes for each per-node count of `shape` (largest first), best fit or worst fit;
        None when the shape does not fit now. Does not take the GPUs."""
        shape = sorted(shape, reverse=True)
        if sum(shape) > self.total:
            return None
        used: set[int] = set()
        out = []
        for need in shape:
            node = self._pick(need, used, best_fit)
            if node is None:
                return None
            used.add(node)
            out.append((node, need))
        return tuple(out)

    def whole_nodes(self, count: int) -> Placement | None:
        """`count` wholly free nodes (exclusive allocation, as LSF does)."""
        bucket = self.buckets[self.spec.gpus_per_node]
        if len(bucket) < count:
            return None
        nodes = []
        for node in bucket:
            nodes.append(node)
            if len(nodes) == count:
                break
        return tuple((n, self.spec.gpus_per_node) for n in nodes)

    def spread(self, gpus: int) -> Placement | None:
        """`gpus` GPUs on as few nodes as the free map allows (most-free nodes first)."""
        if gpus > self.total:
            return None
        out = []
        left = gpus
        for f in range(self.spec.gpus_per_node, 0, -1):
            for node in self.buckets[f]:
                take = min(f, left)
                out.append((node, take))
                left -= take
                if left == 0:
                    return tuple(out)
        return None
