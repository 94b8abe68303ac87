"""Cluster shape and per-node free GPUs (nodes may differ in GPU count: `ClusterSpec.node_gpus`).

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
    """`nodes` nodes of `gpus_per_node` GPUs, or, with `node_gpus`, nodes of different sizes
    (`gpus_per_node` is then the largest: policies lay shapes out for it first, and best fit puts
    each per-node count only on a node with that many GPUs free; a layout that cannot fit the
    node sizes falls back to `FreeMap.spread`, and exclusive allocation takes whole nodes of any
    size, so every job of at most `total_gpus` GPUs can run on an empty cluster)."""

    nodes: int
    gpus_per_node: int
    node_gpus: tuple[int, ...] = ()   # per-node GPU counts of a mixed cluster; () = all gpus_per_node

    def __post_init__(self) -> None:
        require(1 <= self.nodes <= MAX_NODES, f"a cluster has 1..{MAX_NODES:,} nodes, got {self.nodes:,}")
        require(1 <= self.gpus_per_node <= 64, f"gpus per node must be in 1..64, got {self.gpus_per_node}")
        if self.node_gpus:
            require(len(self.node_gpus) == self.nodes, f"node_gpus lists {len(self.node_gpus)} nodes, not {self.nodes}")
            require(all(1 <= g <= 64 for g in self.node_gpus), "every node has 1..64 GPUs")
            require(max(self.node_gpus) == self.gpus_per_node, "gpus_per_node must be the largest node's count")

    @classmethod
    def of_nodes(cls, gpus: tuple[int, ...] | list[int]) -> ClusterSpec:
        """A cluster from per-node GPU counts (uniform ones give the plain NODESxGPUS spec)."""
        gpus = tuple(gpus)
        require(len(gpus) >= 1, "a cluster has at least one node")
        if len(set(gpus)) == 1:
            return cls(len(gpus), gpus[0])
        return cls(len(gpus), max(gpus), gpus)

    def can_hold(self, shape: Iterable[int]) -> bool:
        """Whether an empty cluster of these node sizes can hold `shape` (per-node GPU counts)."""
        need = sorted(shape, reverse=True)
        if not self.node_gpus:
            return len(need) <= self.nodes and (not need or need[0] <= self.gpus_per_node)
        caps = sorted(self.node_gpus, reverse=True)
        return len(need) <= len(caps) and all(n <= c for n, c in zip(need, caps, strict=False))

    def capacity(self, node: int) -> int:
        return self.node_gpus[node] if self.node_gpus else self.gpus_per_node

    @property
    def total_gpus(self) -> int:
        return sum(self.node_gpus) if self.node_gpus else self.nodes * self.gpus_per_node

    @classmethod
    def parse(cls, text: str) -> ClusterSpec:
        """'16x6' = 16 nodes with 6 GPUs each; '8x4+4x8' = 8 nodes of 4 and 4 of 8 (mixed)."""
        parts = [re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", p) for p in text.split("+")]
        if not all(parts):
            raise ValueError(f"cluster must look like NODESxGPUS (e.g. 16x6) or NODESxGPUS+NODESxGPUS for mixed "
                             f"nodes (e.g. 8x4+4x8), got {text!r}")
        if len(parts) == 1:
            return cls(int(parts[0].group(1)), int(parts[0].group(2)))
        counts = [(int(m.group(1)), int(m.group(2))) for m in parts]
        require(sum(n for n, _ in counts) <= MAX_NODES, f"a cluster has 1..{MAX_NODES:,} nodes")
        return cls.of_nodes([g for n, g in counts for _ in range(n)])

    def __str__(self) -> str:
        if not self.node_gpus:
            return f"{self.nodes}x{self.gpus_per_node}"
        runs: list[list[int]] = []
        for g in self.node_gpus:
            if runs and runs[-1][1] == g:
                runs[-1][0] += 1
            else:
                runs.append([1, g])
        return "+".join(f"{n}x{g}" for n, g in runs)


class FreeMap:
    def __init__(self, spec: ClusterSpec) -> None:
        self.spec = spec
        self.free = list(spec.node_gpus) if spec.node_gpus else [spec.gpus_per_node] * spec.nodes
        self.buckets: list[dict[int, None]] = [{} for _ in range(spec.gpus_per_node + 1)]
        for node, gpus in enumerate(self.free):
            self.buckets[gpus][node] = None
        self.total = spec.total_gpus
        self.whole: dict[int, None] = dict.fromkeys(range(spec.nodes))   # wholly free nodes
        self.whole_gpus = spec.total_gpus

    def copy(self) -> FreeMap:
        other = FreeMap.__new__(FreeMap)
        other.spec = self.spec
        other.free = self.free.copy()
        other.buckets = [b.copy() for b in self.buckets]
        other.total = self.total
        other.whole = self.whole.copy()
        other.whole_gpus = self.whole_gpus
        return other

    def _move(self, node: int, new_free: int) -> None:
        old = self.free[node]
        if not 0 <= new_free <= self.spec.capacity(node):
            raise ValueError(f"node {node} would have {new_free} free GPUs (of {self.spec.capacity(node)})")
        cap = self.spec.capacity(node)
        del self.buckets[old][node]
        self.buckets[new_free][node] = None
        self.free[node] = new_free
        self.total += new_free - old
        if old == cap:
            del self.whole[node]
            self.whole_gpus -= cap
        if new_free == cap:
            self.whole[node] = None
            self.whole_gpus += cap

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

    def whole_free_gpus(self) -> int:
        """GPUs on wholly free nodes (what exclusive whole-node allocation can use)."""
        return self.whole_gpus

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

    def whole_nodes(self, gpus: int) -> Placement | None:
        """Wholly free nodes with at least `gpus` GPUs together (exclusive allocation, as LSF does):
        the smallest single node that is big enough, else the largest nodes first (then the last
        one swapped for the smallest that still covers the rest). None when they do not suffice."""
        if gpus > self.whole_gpus:
            return None
        cap = self.spec.capacity
        if not self.spec.node_gpus:   # uniform nodes: the first ones free
            count = -(-gpus // self.spec.gpus_per_node)
            return tuple((n, self.spec.gpus_per_node) for n, _ in zip(self.whole, range(count), strict=False))
        nodes = sorted(self.whole, key=lambda n: (-cap(n), n))
        out, left = [], gpus
        for i, node in enumerate(nodes):
            if cap(node) >= left:
                last = min((n for n in nodes[i:] if cap(n) >= left), key=lambda n: (cap(n), n))
                return tuple(out + [(last, cap(last))])
            out.append((node, cap(node)))
            left -= cap(node)
        return None

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
