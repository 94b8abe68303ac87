"""ZeRO-3 style data movement between ranks: parameters gathered for compute, gradients reduced to their owner.

* Gather (`Gatherer.gather`, before a module's forward or backward use, in the order the use tracker
  reports uses, which is the same on every rank): the owner makes its tensor resident with its own policy
  (prefetched along its profiled order), then broadcasts the compute copy from its device slot; every
  other rank receives it into a gather buffer of that shape and binds the parameter to it.
* Free (`Gatherer.drop`, when the tracker releases the tensor): a non-owner's buffer goes back to a free
  list per (dtype, shape) and the parameter points at its placeholder again, so between uses a rank holds
  only its own tensors. Buffers are reused, so a step allocates nothing once the largest set gathered at
  once has been seen (`peak_bytes` measures it).
* Reduce (`Gatherer.reduce_grad`, in the gradient hook): each rank's gradient, in fp32, is summed into the
  owner's copy (`dist.reduce` to the owner; the per-tensor form of ZeRO's reduce-scatter); only the owner
  adds it into its optimizer state and runs AdamW for it. With two ranks the sum a+b is exactly the fp32
  sum a single process takes over the same two micro-batches, so the runs are bit-identical.
* Streams (`stream_states`, `stream_weights`): every tensor's fp32 state or weight, broadcast from its owner
  over the CPU group one tensor at a time, for a consolidated checkpoint, export or materialisation.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from mlsyskit.tools.offload.ranks import RankGroup
from mlsyskit.tools.offload.shards import Shards
from mlsyskit.tools.offload.tiers import Entry, TierStore


class Gatherer:
    """Gather buffers for the tensors this rank does not own; see the module docstring."""

    def __init__(self, ranks: RankGroup, shards: Shards, store: TierStore) -> None:
        self.ranks = ranks
        self.shards = shards
        self.store = store
        self.live: dict[int, torch.Tensor] = {}  # tensor idx -> its gather buffer, while in use
        self._free: dict[tuple[torch.dtype, tuple[int, ...]], list[torch.Tensor]] = {}
        self.live_bytes = 0
        self.peak_bytes = 0  # most bytes of other ranks' tensors held at once
        self.allocations = 0
        self.gathered_bytes = 0  # received, all steps

    def gather(self, entries: list[Entry]) -> None:
        """Every rank calls this with the same entries in the same order; afterwards each is bound to its
        compute copy (owned: the policy bound it to its slot before; others: a gather buffer)."""
        me = self.ranks.rank
        for e in entries:
            owner = self.shards.owner[e.idx]
            if owner == me:
                self.ranks.broadcast(self.store.device_view(e), owner, e.name)
                continue
            buf = self.live.get(e.idx)
            if buf is None:
                buf = self._take(e)
                self.live[e.idx] = buf
                self.live_bytes += e.nbytes
                self.peak_bytes = max(self.peak_bytes, self.live_bytes)
            self.ranks.broadcast(buf, owner, e.name)
            self.gathered_bytes += e.nbytes
            e.param.data = buf
            e.bound = True

    def drop(self, entries: list[Entry]) -> None:
        """Free the gather buffers of `entries` this rank does not own (its own are the policy's)."""
        for e in entries:
            buf = self.live.pop(e.idx, None)
            if buf is None:
                continue
            self.live_bytes -= e.nbytes
            self.store.unbind(e)
            self._free.setdefault((e.dtype, tuple(e.shape)), []).append(buf)

    def _take(self, e: Entry) -> torch.Tensor:
        free = self._free.get((e.dtype, tuple(e.shape)))
        if free:
            return free.pop()
        self.allocations += 1
        return torch.empty(e.shape, dtype=e.dtype, device=self.store.device)

    def reduce_grad(self, e: Entry, grad: torch.Tensor) -> torch.Tensor | None:
        """Sum e's gradient over the ranks in fp32 into its owner: the flat fp32 sum there, None elsewhere."""
        g = grad.detach().reshape(-1).to(torch.float32)
        owner = self.shards.owner[e.idx]
        self.ranks.reduce(g, owner, f"the gradient of {e.name}")
        return g if owner == self.ranks.rank else None

    def close(self) -> None:
        for e in list(self.store.entries):
            if e.idx in self.live:
                self.drop([e])
        self._free.clear()


def stream_states(ranks: RankGroup, shards: Shards, states: Any, trainable: list[Entry]) \
        -> Iterator[tuple[str, torch.Tensor]]:
    """(name, fp32 master|m|v) of every trainable tensor on every rank, in `trainable` order, each broadcast
    from its owner's state cache (`states`: optimizer.OptimizerStateCache); valid until the next item."""
    states.flush()
    for e in trainable:
        owner = shards.owner[e.idx]
        n = 3 * e.shape.numel()
        buf = states.peek(e.idx)[:n] if owner == ranks.rank else torch.empty(n, dtype=torch.float32)
        ranks.broadcast(buf.contiguous(), owner, f"the optimizer state of {e.name}")
        yield e.name, buf


def stream_weights(ranks: RankGroup, shards: Shards, states: Any, store: TierStore) \
        -> Iterator[tuple[Entry, torch.Tensor]]:
    """(entry, value) of every tensor on every rank: a trainable one's fp32 master, a frozen one's compute
    copy, broadcast from its owner one at a time."""
    states.flush()
    for e in store.entries:
        owner = shards.owner[e.idx]
        numel = e.shape.numel()
        if owner == ranks.rank:
            buf = states.peek(e.idx)[:numel].contiguous() if e.trainable else store.read_home(e).reshape(-1)
        else:
            buf = torch.empty(numel, dtype=torch.float32 if e.trainable else e.dtype)
        ranks.broadcast(buf, owner, f"the weights of {e.name}")
        yield e, buf.view(e.shape)
