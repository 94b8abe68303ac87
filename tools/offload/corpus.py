"""The training corpus: six Shakespeare plays (vendored, public domain) as byte-level tokens.

Batches are a pure function of (seed, step), so a resumed run sees exactly the batches an
uninterrupted run would have seen, with no sampler state to checkpoint.
"""
from __future__ import annotations

import functools
from importlib import resources

import numpy as np
import torch

from mlsyskit.core.sim import sub_seed

VOCAB_SIZE = 256  # byte-level tokens


@functools.cache
def corpus_bytes() -> np.ndarray:
    """All vendored plays concatenated, as uint8 tokens (about 730k)."""
    root = resources.files("mlsyskit.tools.offload.data.shakespeare")
    texts = sorted(p.name for p in root.iterdir() if p.name.endswith("_gut.txt"))
    if not texts:
        raise FileNotFoundError("no Shakespeare texts found in mlsyskit.tools.offload.data.shakespeare")
    data = b"\n\n".join(root.joinpath(name).read_bytes() for name in texts)
    return np.frombuffer(data, dtype=np.uint8).copy()


def batch(step: int, batch_size: int, seq_len: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and next-byte targets, each (batch_size, seq_len) int64, for training step `step`."""
    tokens = corpus_bytes()
    if seq_len + 1 >= len(tokens):
        raise ValueError(f"sequence length {seq_len} is longer than the corpus ({len(tokens)} bytes)")
    rng = np.random.default_rng(sub_seed(seed, f"batch:{step}"))
    starts = rng.integers(0, len(tokens) - seq_len - 1, size=batch_size)
    rows = np.stack([tokens[s:s + seq_len + 1] for s in starts]).astype(np.int64)
    window = torch.from_numpy(rows)
    return window[:, :-1].contiguous(), window[:, 1:].contiguous()
