"""What `tencache train` trains on: a GPT preset or a user's `package.module:factory`, and the Shakespeare
corpus, a token file or a user's `package.module:loader`.

A factory is called with no arguments after torch's RNG is seeded with sub_seed(seed, "init") and returns an
nn.Module whose `forward(x, y)` returns the scalar loss (as the presets do). A loader is called as
`loader(step, batch, seq, seed)` and returns the inputs and targets (two int64 tensors of shape (batch,
seq)) for that step: a pure function of its arguments, so a resumed run sees the batches an uninterrupted
one would. A token file is a 1-D array of token ids: `.npy`, `.pt` (a 1-D integer tensor), or raw bytes
(one uint8 token each, as the corpus); its batches are windows drawn like the corpus's.
"""
from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from mlsyskit.core.errors import UsageError
from mlsyskit.core.sim import sub_seed
from mlsyskit.tools.offload import corpus
from mlsyskit.tools.offload.model import PRESETS, build_model

Batches = Callable[[int], tuple[torch.Tensor, torch.Tensor]]


def is_spec(text: str) -> bool:
    """`package.module:attribute`."""
    mod, sep, attr = text.partition(":")
    return bool(sep and mod and attr.isidentifier() and all(p.isidentifier() for p in mod.split(".")))


def load_object(spec: str, what: str) -> Any:
    mod, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(mod)
    except ImportError as e:
        raise UsageError(f"{what} {spec!r}: cannot import {mod}: {e}") from None
    obj = getattr(module, attr, None)
    if not callable(obj):
        raise UsageError(f"{what} {spec!r}: {mod} has no callable {attr!r}")
    return obj


def check_model_spec(model: str) -> None:
    if model not in PRESETS and not is_spec(model):
        raise UsageError(f"unknown model {model!r}: a preset ({', '.join(PRESETS)}) or package.module:factory")


def build(model: str, seed: int, *, lazy: bool = False) -> tuple[nn.Module, Any]:
    """(model, fp32 initial values by name). Presets: bf16 compute copies, values generated per tensor (on the
    meta device with `lazy`). A factory's model is built in memory in its own dtype; the values are its own
    tensors (the caller converts, api.to_compute_dtype)."""
    if model in PRESETS:
        return build_model(model, seed, lazy=lazy)
    factory = load_object(model, "--model")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(sub_seed(seed, "init"))
        built = factory()
    if not isinstance(built, nn.Module):
        raise UsageError(f"--model {model!r}: the factory returned {type(built).__name__}, not an nn.Module")
    return built, None


@functools.cache
def _tokens(path: str) -> torch.Tensor:
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"--data {path}: no such file")
    try:
        if p.suffix == ".npy":
            arr = torch.from_numpy(np.load(p, allow_pickle=False))
        elif p.suffix == ".pt":
            arr = torch.load(p, weights_only=True)
        else:
            arr = torch.from_numpy(np.fromfile(p, dtype=np.uint8))
    except (OSError, ValueError, RuntimeError) as e:
        raise UsageError(f"--data {path}: unreadable ({e})") from None
    if not isinstance(arr, torch.Tensor) or arr.dim() != 1 or arr.dtype.is_floating_point or arr.is_complex():
        raise UsageError(f"--data {path}: expected a 1-D array of integer token ids")
    return arr.to(torch.int64)


def token_batch(tokens: torch.Tensor, step: int, batch: int, seq: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    if seq + 1 >= len(tokens):
        raise UsageError(f"--seq {seq} is longer than the token file ({len(tokens)} tokens)")
    rng = np.random.default_rng(sub_seed(seed, f"batch:{step}"))
    starts = rng.integers(0, len(tokens) - seq - 1, size=batch)
    window = torch.stack([tokens[s:s + seq + 1] for s in starts])
    return window[:, :-1].contiguous(), window[:, 1:].contiguous()


def batches(data: str | None, batch: int, seq: int, seed: int) -> Batches:
    """step -> (x, y) for `--data` (None: the Shakespeare corpus)."""
    if data is None:
        return lambda step: corpus.batch(step, batch, seq, seed)
    if is_spec(data) and not Path(data).exists():
        loader = load_object(data, "--data")

        def load(step: int) -> tuple[torch.Tensor, torch.Tensor]:
            out = loader(step, batch, seq, seed)
            if not (isinstance(out, tuple) and len(out) == 2 and all(isinstance(t, torch.Tensor) for t in out)):
                raise UsageError(f"--data {data!r}: the loader must return (inputs, targets) tensors")
            return out

        return load
    tokens = _tokens(data)
    return lambda step: token_batch(tokens, step, batch, seq, seed)
