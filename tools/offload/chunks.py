"""Fixed-size chunks of a tensor's elements: the unit of the optimizer-state cache and of NVMe blocks.

A tensor of n elements is split into ceil(n / CHUNK_ELEMS) chunks of CHUNK_ELEMS elements (the last one
shorter). The 10Cache size classes apply to chunks, so a budget holds some chunks of a tensor, never
necessarily all of it: a 32000x768 embedding (24.6M elements) is 24 chunks of 16 MiB of fp32 state
(master, m, v, gradient) instead of one 375 MiB slot. CHUNK_ELEMS is a multiple of 2048, so every chunk
of a 2- or 4-byte tensor starts 4096-aligned within the tensor (O_DIRECT reads straight into a slot).
"""
from __future__ import annotations

CHUNK_ELEMS = 1 << 20  # elements per chunk (read when a cache or store is built: tests may lower it)
ALIGN_ELEMS = 2048


def chunk_ranges(numel: int, chunk: int | None = None) -> list[tuple[int, int]]:
    """[(lo, hi)) element ranges covering `numel` elements; one empty range for an empty tensor."""
    chunk = CHUNK_ELEMS if chunk is None else chunk
    if chunk <= 0 or chunk % ALIGN_ELEMS:
        raise ValueError(f"chunk size {chunk} must be a positive multiple of {ALIGN_ELEMS} elements")
    if numel <= 0:
        return [(0, 0)]
    return [(lo, min(lo + chunk, numel)) for lo in range(0, numel, chunk)]
