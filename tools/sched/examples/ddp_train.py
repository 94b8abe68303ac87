"""An example marble job: data-parallel training with torch DistributedDataParallel over gloo,
one process per GPU it is given (logical GPUs on a machine without any: one CPU process each).

    python -m mlsyskit.tools.sched.examples.ddp_train --steps 50          # as a marble job
    marble profile --cmd "python -m mlsyskit.tools.sched.examples.ddp_train" --gpus 1,2,4

Run by the daemon it appends `time samples loss` lines to MARBLE_PROGRESS (the daemon's measured
rate and loss reports for the policy). The world size is the number of ids in CUDA_VISIBLE_DEVICES (what marble hands the job), else 1.
The global batch stays fixed (each of K processes takes batch/K), as marble's model assumes. Under
`marble profile` (MARBLE_PROFILE_OUT set) it trains for MARBLE_PROFILE_SECONDS and writes what it
measured: the full step time, and the compute-only step time from steps run under DDP's no_sync()
(no gradient all-reduce); the difference of the two kinds' fastest steps is the sync time.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

from mlsyskit.core.net import free_port


def world_size() -> int:
    ids = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    return max(1, len(ids))


def _worker(rank: int, world: int, port: int, args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)  # one core per process: a logical GPU is one worker
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    torch.manual_seed(args.seed)
    model = torch.nn.Sequential(torch.nn.Linear(args.features, args.width), torch.nn.ReLU(),
                                torch.nn.Linear(args.width, args.width), torch.nn.ReLU(),
                                torch.nn.Linear(args.width, 10))
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    local = max(1, args.batch // world)
    gen = torch.Generator().manual_seed(args.seed * 1000 + rank)
    teacher = torch.Generator().manual_seed(args.seed)
    w_true = torch.randn(args.features, 10, generator=teacher)

    def step(sync: bool) -> float:
        x = torch.randn(local, args.features, generator=gen)
        y = (x @ w_true).argmax(dim=1)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        if sync:
            loss = torch.nn.functional.cross_entropy(ddp(x), y)
            loss.backward()
        else:
            with ddp.no_sync():
                loss = torch.nn.functional.cross_entropy(ddp(x), y)
                loss.backward()
        opt.step()
        step.loss = float(loss.detach())
        return time.perf_counter() - t0

    profile_out = os.environ.get("MARBLE_PROFILE_OUT")
    progress = os.environ.get("MARBLE_PROGRESS")
    full: list[float] = []
    compute: list[float] = []
    for _ in range(3):  # warm-up
        step(True)
    deadline = time.perf_counter() + float(os.environ.get("MARBLE_PROFILE_SECONDS", "0") or 0)
    i = 0
    # Profiling stops on the all-reduced flag only: a loop condition read from each rank's own clock
    # let one rank leave while another entered the next all-reduce (a CI failure: peer closed).
    while i < args.steps or profile_out:
        flag = torch.tensor([1 if profile_out and time.perf_counter() >= deadline and len(compute) >= 3 else 0])
        dist.all_reduce(flag)  # every rank stops at the same step
        if flag.item():
            break
        sync = not profile_out or i % 4 != 3
        (full if sync else compute).append(step(sync))
        if rank == 0 and not profile_out and (i % 10 == 0 or i == args.steps - 1):
            print(f"step {i} loss {step.loss:.4f} world {world} local batch {local}", flush=True)
            if progress:  # marble's daemon reads measured throughput and loss from here
                with open(progress, "a") as f:
                    f.write(f"{time.time():.3f} {(i + 1) * local * world} {step.loss:.6f}\n")
        i += 1
    if profile_out and rank == 0:
        step_time = statistics.median(full)
        # The sync share compares the fastest steps of each kind: a median of the few no_sync steps could
        # land above the full steps' median on a busy host (sync 0.0 once in CI at load 24), while each
        # kind's minimum is the step least disturbed by other load.
        sync_time = max(0.0, min(full) - min(compute)) if world > 1 else 0.0
        doc = {"gpus": world, "global_batch": local * world, "local_bsz": local, "steps": len(full) + len(compute),
               "step_time": step_time, "sync_time": sync_time,
               "samples_per_s": local * world / step_time}
        with open(profile_out, "w") as f:
            json.dump(doc, f)
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=50, help="training steps (ignored under marble profile)")
    parser.add_argument("--batch", type=int, default=256, help="global batch, split over the processes")
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--features", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    world = world_size()
    port = free_port()  # the project's picker: outside the ephemeral range, where a connect() could take it first
    if world == 1:
        _worker(0, 1, port, args)
        return
    _spawn(world, port, args)


def _spawn(world: int, port: int, args: argparse.Namespace) -> None:
    """One process per rank, as torch.multiprocessing.start_processes(join=True) starts them, but from
    the standard library: the workers import torch and this process does not (an import of torch costs
    seconds of CPU). The first worker to fail stops the others (they would wait in an all-reduce)."""
    import multiprocessing
    from multiprocessing.connection import wait

    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_worker, args=(rank, world, port, args)) for rank in range(world)]
    for p in procs:
        p.start()
    alive = {p.sentinel: p for p in procs}
    while alive:
        for sentinel in wait(list(alive)):
            p = alive.pop(sentinel)
            p.join()
            if p.exitcode != 0:
                for other in alive.values():
                    other.terminate()
                for other in alive.values():
                    other.join()
                raise SystemExit(f"ddp_train: rank {procs.index(p)} exited with status {p.exitcode}")


if __name__ == "__main__":
    main()
