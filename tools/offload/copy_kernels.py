"""Batched copies of many small tensors in one launch.

`batched_copy(dsts, srcs)` copies srcs[i] into dsts[i] for all i. With CuPy and CUDA, when every tensor is
on the GPU or in pinned host memory (device-addressable under UVA), one CuPy kernel moves all segments:
one grid row per segment, 16-byte vector loads when the segment allows. Otherwise it falls back to
`torch._foreach_copy_` (one dispatch for the whole list) or a plain loop. The path taken is returned so
callers and tests can see it.
"""
from __future__ import annotations

import contextlib
import functools
from collections.abc import Sequence
from typing import Any

import torch

_KERNEL_SRC = r"""
extern "C" __global__ void batched_copy(const unsigned long long* src, const unsigned long long* dst,
                                        const unsigned long long* nbytes) {
    const unsigned long long seg = blockIdx.x;
    const unsigned long long s = src[seg], d = dst[seg], n = nbytes[seg];
    const unsigned long long start = (unsigned long long)blockIdx.y * blockDim.x + threadIdx.x;
    const unsigned long long step = (unsigned long long)gridDim.y * blockDim.x;
    if (((s | d | n) & 15ULL) == 0) {
        const uint4* s4 = (const uint4*)s;
        uint4* d4 = (uint4*)d;
        for (unsigned long long i = start; i < (n >> 4); i += step) d4[i] = s4[i];
    } else {
        const unsigned char* s1 = (const unsigned char*)s;
        unsigned char* d1 = (unsigned char*)d;
        for (unsigned long long i = start; i < n; i += step) d1[i] = s1[i];
    }
}
"""
_THREADS = 256


@functools.cache
def _cupy_kernel() -> Any | None:
    try:
        import cupy  # noqa: F401 (optional GPU extra)
    except Exception:
        return None
    if not torch.cuda.is_available():
        return None
    import cupy

    return cupy.RawKernel(_KERNEL_SRC, "batched_copy")


def cupy_available() -> bool:
    return _cupy_kernel() is not None


def _device_addressable(t: torch.Tensor) -> bool:
    return t.is_contiguous() and (t.is_cuda or (t.device.type == "cpu" and t.is_pinned()))


def batched_copy(dsts: Sequence[torch.Tensor], srcs: Sequence[torch.Tensor], *,
                 stream: torch.cuda.Stream | None = None) -> str:
    """Copy each src into its dst (same byte size); returns "cupy", "foreach" or "loop"."""
    if len(dsts) != len(srcs):
        raise ValueError(f"batched_copy: {len(dsts)} destinations for {len(srcs)} sources")
    for i, (d, s) in enumerate(zip(dsts, srcs, strict=True)):
        if d.numel() * d.element_size() != s.numel() * s.element_size():
            raise ValueError(f"batched_copy: segment {i} copies {s.numel() * s.element_size()} bytes "
                             f"into {d.numel() * d.element_size()}")
    if not dsts:
        return "loop"
    tensors = list(dsts) + list(srcs)
    cuda = any(t.is_cuda for t in tensors)
    if cuda and stream is not None:
        # the producers of srcs (and earlier readers of dsts) run on the current stream: order after them
        stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream) if cuda and stream is not None else contextlib.nullcontext():
        path = _copy(dsts, srcs, stream if cuda else None, tensors)
    if cuda:
        if stream is not None:
            for t in tensors:  # the caching allocator must not hand these out again before the copy runs
                if t.is_cuda:
                    t.record_stream(stream)
        else:
            torch.cuda.current_stream().synchronize()  # non_blocking copies: done when we return
    return path


def _copy(dsts: Sequence[torch.Tensor], srcs: Sequence[torch.Tensor], stream: torch.cuda.Stream | None,
          tensors: list[torch.Tensor]) -> str:
    kernel = _cupy_kernel()
    if kernel is not None and any(t.is_cuda for t in tensors) and all(_device_addressable(t) for t in tensors):
        _launch(kernel, dsts, srcs, stream or torch.cuda.current_stream())
        return "cupy"
    same_dtypes = all(d.dtype == s.dtype and d.shape == s.shape for d, s in zip(dsts, srcs, strict=True))
    if same_dtypes and hasattr(torch, "_foreach_copy_"):
        torch._foreach_copy_(list(dsts), list(srcs), non_blocking=True)
        return "foreach"
    for d, s in zip(dsts, srcs, strict=True):
        d.view(-1).view(torch.uint8).copy_(s.reshape(-1).view(torch.uint8), non_blocking=True)
    return "loop"


def plan_batches(sizes: Sequence[int], *, max_segments: int, max_bytes: int) -> list[list[int]]:
    """Group copies (byte sizes, in request order) into launches: consecutive copies share a batch while it
    has fewer than `max_segments` segments and the bytes stay within `max_bytes`; a copy larger than
    `max_bytes` is a batch of its own. Returns the indices per batch, every index exactly once, in order."""
    if max_segments < 1 or max_bytes < 1:
        raise ValueError(f"plan_batches: max_segments and max_bytes must be >= 1, got {max_segments}, {max_bytes}")
    batches: list[list[int]] = []
    current: list[int] = []
    total = 0
    for i, n in enumerate(sizes):
        if n < 0:
            raise ValueError(f"plan_batches: copy {i} has a negative size {n}")
        if current and (len(current) >= max_segments or total + n > max_bytes):
            batches.append(current)
            current, total = [], 0
        current.append(i)
        total += n
    if current:
        batches.append(current)
    return batches


def segment_table(dsts: Sequence[torch.Tensor], srcs: Sequence[torch.Tensor]) -> torch.Tensor:
    """The kernel's argument table, int64 of shape (3, n): source addresses, destination addresses, bytes;
    row i of each is segment i (one grid row of the launch)."""
    sizes = [d.numel() * d.element_size() for d in dsts]
    return torch.tensor([[s.data_ptr() for s in srcs], [d.data_ptr() for d in dsts], sizes], dtype=torch.int64)


def _launch(kernel: Any, dsts: Sequence[torch.Tensor], srcs: Sequence[torch.Tensor],
            torch_stream: torch.cuda.Stream) -> None:
    import cupy

    sizes = [d.numel() * d.element_size() for d in dsts]
    table = segment_table(dsts, srcs).pin_memory()
    with torch.cuda.stream(torch_stream):
        device_table = table.to("cuda", non_blocking=True)
    chunks = max(1, min(1024, max(sizes) // (_THREADS * 16 * 4) + 1))
    with cupy.cuda.ExternalStream(torch_stream.cuda_stream):
        args = tuple(cupy.asarray(device_table[i]) for i in range(3))
        kernel((len(dsts), chunks), (_THREADS,), args)
    # the caching allocator must not reuse the pointer table before the kernel that reads it has run
    device_table.record_stream(torch_stream)
