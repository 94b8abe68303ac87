#!/usr/bin/env python3
"""Host<->device copy figures on a CUDA GPU (run by scripts/gpu_check; needs CUDA).

1. Bandwidth of one large copy from pinned memory (a pool slot page-locked exactly by
   mlsyskit.tools.offload.memory) against the same copy from pageable memory, both directions; medians of
   `--repeats` copies timed with CUDA events, in the same run.
2. Many small tensors host->device: one `batched_copy` launch (CuPy kernel, or torch's foreach copy
   without CuPy) against one `copy_(non_blocking=True)` per tensor, both from a pinned pool to a device
   pool; medians, and the copies checked equal byte for byte.

Prints a table on stdout and writes the figures as JSON to --out.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from pathlib import Path

import torch

from mlsyskit.tools.offload.copy_kernels import batched_copy, cupy_available
from mlsyskit.tools.offload.memory import BufferPool, aligned_empty


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--large-mib", type=int, default=256, help="size of the large copy (MiB)")
    p.add_argument("--small", type=int, default=2000, help="number of small tensors")
    p.add_argument("--small-max-kib", type=int, default=64, help="largest small tensor (KiB)")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("runs/bench_gpu_copies.json"))
    args = p.parse_args(argv)
    if min(args.large_mib, args.small, args.small_max_kib, args.repeats) < 1:
        p.error("sizes, counts and repeats must be >= 1")
    return args


def timed(fn, repeats: int) -> float:
    """Median seconds of `fn` (which enqueues work on the current stream), timed with CUDA events."""
    fn()  # warm-up
    torch.cuda.synchronize()
    out = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end) / 1e3)
    return statistics.median(out)


def bandwidth(nbytes: int, repeats: int) -> dict[str, float]:
    device = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    pinned = aligned_empty(nbytes, pin=True)
    pageable = torch.empty(nbytes, dtype=torch.uint8)
    pinned.fill_(1)
    pageable.fill_(1)
    gbps = lambda s: nbytes / s / 1e9  # noqa: E731
    return {
        "bytes": nbytes,
        "h2d_pinned_GBps": gbps(timed(lambda: device.copy_(pinned, non_blocking=True), repeats)),
        "h2d_pageable_GBps": gbps(timed(lambda: device.copy_(pageable, non_blocking=True), repeats)),
        "d2h_pinned_GBps": gbps(timed(lambda: pinned.copy_(device, non_blocking=True), repeats)),
        "d2h_pageable_GBps": gbps(timed(lambda: pageable.copy_(device, non_blocking=True), repeats)),
    }


def small_copies(count: int, max_bytes: int, repeats: int, seed: int) -> dict[str, float | str]:
    rng = random.Random(seed)
    sizes = [rng.randrange(256, max_bytes + 1) for _ in range(count)]
    classes: dict[int, int] = {}
    for n in sizes:
        classes[n] = classes.get(n, 0) + 1
    host = BufferPool(classes, name="pinned source")  # pinned: CUDA is present
    dev = BufferPool(classes, device="cuda", name="device target")
    srcs = [host.acquire(n, i, exact=True).data[:n] for i, n in enumerate(sizes)]
    dsts = [dev.acquire(n, i, exact=True).data[:n] for i, n in enumerate(sizes)]
    g = torch.Generator().manual_seed(seed)
    for s in srcs:
        s.copy_(torch.randint(0, 256, (s.numel(),), dtype=torch.uint8, generator=g))
    stream = torch.cuda.current_stream()
    path = batched_copy(dsts, srcs, stream=stream)
    batched_s = timed(lambda: batched_copy(dsts, srcs, stream=stream), repeats)
    batched_ok = all(torch.equal(d.cpu(), s) for d, s in zip(dsts, srcs, strict=True))
    for d in dsts:
        d.zero_()

    def per_tensor() -> None:
        for d, s in zip(dsts, srcs, strict=True):
            d.copy_(s, non_blocking=True)

    per_tensor_s = timed(per_tensor, repeats)
    per_tensor_ok = all(torch.equal(d.cpu(), s) for d, s in zip(dsts, srcs, strict=True))
    return {"tensors": count, "bytes": sum(sizes), "batched_path": path, "cupy": cupy_available(),
            "batched_s": batched_s, "per_tensor_s": per_tensor_s, "speedup": per_tensor_s / batched_s,
            "batched_equal": batched_ok, "per_tensor_equal": per_tensor_ok}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("error: needs a CUDA device (run on a GPU machine via scripts/gpu_check)", file=sys.stderr)
        return 1
    result = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
              "bandwidth": bandwidth(args.large_mib << 20, args.repeats),
              "small_copies": small_copies(args.small, args.small_max_kib << 10, args.repeats, args.seed)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    bw, sc = result["bandwidth"], result["small_copies"]
    print("| copy | pinned GB/s | pageable GB/s | pinned/pageable |\n|---|---|---|---|")
    for way in ("h2d", "d2h"):
        pin, page = bw[f"{way}_pinned_GBps"], bw[f"{way}_pageable_GBps"]
        print(f"| {way} {bw['bytes'] >> 20} MiB | {pin:.2f} | {page:.2f} | {pin / page:.2f}x |")
    print(f"\n| {sc['tensors']} small tensors h2d | seconds | equal |\n|---|---|---|")
    print(f"| batched ({sc['batched_path']}) | {sc['batched_s']:.5f} | {sc['batched_equal']} |")
    print(f"| per tensor | {sc['per_tensor_s']:.5f} ({sc['speedup']:.2f}x) | {sc['per_tensor_equal']} |")
    return 0 if sc["batched_equal"] and sc["per_tensor_equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
