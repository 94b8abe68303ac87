"""Several ranks (`torchrun --nproc-per-node N tencache train ...`, gloo on the CPU): data parallelism over the engine.

Each rank runs its own engine over its own tiers (a replica of every parameter and optimizer state: no
sharding) on its share of the global batch: rank r takes micro-batches r*accumulate ... of each step's
world*accumulate, exactly those a single process with accumulate=world*accumulate would take. After
backward the engine sums every fp32 gradient across ranks (an all-reduce per chunk, in the profiled
optimizer order) before the AdamW sweep, so every replica applies the same update; with two ranks the sum
a+b is the single process's a+b, so the losses are bit-identical. Several machines: `torchrun --nnodes`.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class RankGroup:
    rank: int
    world: int

    @classmethod
    def from_env(cls) -> RankGroup | None:
        """The torchrun group of this process (gloo), or None when it runs alone."""
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world <= 1:
            return None
        if not dist.is_initialized():
            dist.init_process_group("gloo")
        return cls(dist.get_rank(), dist.get_world_size())

    def all_reduce(self, t: torch.Tensor) -> None:
        dist.all_reduce(t)

    def gather(self, values: list[float]) -> list[float]:
        """Every rank's `values`, concatenated in rank order (on every rank)."""
        out: list = [None] * self.world
        dist.all_gather_object(out, values)
        return [v for part in out for v in part]

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
