"""Several ranks (`torchrun --nproc-per-node N tencache train ...`; gloo on the CPU, NCCL on GPUs): the process group.

`RankGroup` is this process's place in the torchrun group and every collective the sharded engine makes
(shards.py, gather.py): broadcasts of a tensor from its owner (parameters gathered for compute, states
streamed for a consolidated checkpoint or export), reductions of gradients to their owner, and small
object gathers (losses, squared gradient norms). Every collective runs under the group's timeout
(`--rank-timeout`, default 300 s): a rank that failed or stopped answering makes the others raise
`RankError` naming the collective, never hang. Tensors on the CPU go over a gloo group (with NCCL, a
second, gloo group for them), device tensors over the default group.

Several machines: the same code under `torchrun --nnodes M --nproc-per-node N --rdzv-backend c10d
--rdzv-endpoint HOST:PORT`; each rank keeps its NVMe share in `--nvme-dir/rank<r>` on its own machine and
rank 0 writes checkpoints and exports (a --checkpoint-dir every rank can read, for --resume).
"""
from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from mlsyskit.core.errors import RuntimeFailure

DEFAULT_TIMEOUT_S = 300.0


class RankError(RuntimeFailure):
    """A collective failed: a peer rank failed, exited, or did not answer within the timeout."""


@dataclass
class RankGroup:
    rank: int
    world: int
    local_rank: int = 0
    timeout_s: float = DEFAULT_TIMEOUT_S
    cpu_group: Any = None  # the gloo group for CPU tensors (None: the default group is gloo)
    own_group: bool = field(default=False, repr=False)  # this object initialised the default group

    @classmethod
    def from_env(cls, device_type: str = "cpu", timeout_s: float = DEFAULT_TIMEOUT_S) -> RankGroup | None:
        """The torchrun group of this process, or None when it runs alone (WORLD_SIZE unset or 1). NCCL when
        the engine's device is a GPU (this rank's: LOCAL_RANK), gloo otherwise."""
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world <= 1:
            return None
        if not timeout_s > 0:
            raise ValueError(f"rank timeout must be positive, got {timeout_s}")
        local = int(os.environ.get("LOCAL_RANK", "0"))
        nccl = device_type == "cuda"
        own = not dist.is_initialized()
        if nccl:
            torch.cuda.set_device(local)
        if own:
            try:
                dist.init_process_group("nccl" if nccl else "gloo", timeout=timedelta(seconds=timeout_s))
            except Exception as exc:  # noqa: BLE001 - rendezvous failures come as several torch types
                raise RankError(f"joining the torchrun group (world {world}) failed: {_first_line(exc)}") from exc
        cpu = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s)) if nccl else None
        return cls(dist.get_rank(), dist.get_world_size(), local, timeout_s, cpu, own)

    # -- collectives (same order on every rank) -----------------------------------------------------------
    def _run(self, what: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - gloo and NCCL raise RuntimeError or DistBackendError
            raise RankError(f"rank {self.rank} of {self.world}: {what} failed (a peer rank failed, exited or did not "
                            f"answer within {self.timeout_s:g} s): {_first_line(exc)}") from exc

    def _group(self, t: torch.Tensor) -> Any:
        return self.cpu_group if t.device.type == "cpu" else None

    def broadcast(self, t: torch.Tensor, src: int, what: str) -> None:
        self._run(f"broadcast of {what} from rank {src}", lambda: dist.broadcast(t, src, group=self._group(t)))

    def reduce(self, t: torch.Tensor, dst: int, what: str) -> None:
        """Sum `t` over the ranks into rank `dst`'s `t` (the others' `t` is undefined afterwards)."""
        self._run(f"reduce of {what} to rank {dst}", lambda: dist.reduce(t, dst, group=self._group(t)))

    def all_reduce(self, t: torch.Tensor, what: str = "a tensor") -> None:
        self._run(f"all-reduce of {what}", lambda: dist.all_reduce(t, group=self._group(t)))

    def gather_objects(self, value: Any, what: str = "values") -> list[Any]:
        """Every rank's `value`, in rank order (on every rank)."""
        out: list = [None] * self.world
        self._run(f"gather of {what}", lambda: dist.all_gather_object(out, value, group=self.cpu_group))
        return out

    def gather(self, values: list[float]) -> list[float]:
        """Every rank's `values`, concatenated in rank order (on every rank)."""
        return [v for part in self.gather_objects(values, "losses") for v in part]

    def agree(self, error: BaseException | None, what: str) -> None:
        """Every rank reports whether `what` worked here. Without an `error` of its own, a rank raises
        RankError naming the first rank that failed; with one, it only reports it (the caller re-raises its
        own; a failure to report is ignored: the peers then fail at their own collective)."""
        mine = None if error is None else _first_line(error)
        reports: list = [None] * self.world
        try:
            self._run(f"agreeing on {what}", lambda: dist.all_gather_object(reports, mine, group=self.cpu_group))
        except RankError:
            if error is not None:
                return
            raise
        failed = [(r, m) for r, m in enumerate(reports) if m is not None and r != self.rank]
        if error is None and failed:
            raise RankError(f"rank {self.rank} of {self.world}: {what} failed on rank {failed[0][0]}: {failed[0][1]}")

    def barrier(self, what: str = "barrier") -> None:
        self._run(what, lambda: dist.barrier(group=self.cpu_group))

    def close(self) -> None:
        """Leave the group (once; a peer still in a collective with this rank then fails at once)."""
        if self.own_group and dist.is_initialized():
            self.own_group = False
            dist.destroy_process_group()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"
