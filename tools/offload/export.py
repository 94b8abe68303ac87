"""Consolidated weights as one safetensors file, written one tensor at a time (the model is never whole in memory).

The safetensors layout: an 8-byte little-endian header length, a JSON header naming each tensor's dtype,
shape and byte range, then the tensors' bytes back to back. Every name, dtype and shape is known before any
value is read, so the header is written first and each tensor is appended as it streams in (from the
engine's state cache: `OffloadEngine.export`, or from a checkpoint: `tencache export`). Written under a
temporary name and renamed into place, so a failure leaves no partial file.
"""
from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16", torch.float64: "F64",
          torch.int64: "I64", torch.int32: "I32", torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL"}


def write_safetensors(path: Path, specs: list[tuple[str, torch.dtype, tuple[int, ...]]],
                      tensors: Iterable[torch.Tensor], metadata: dict[str, str] | None = None) -> Path:
    """Write `tensors` (in the order of `specs`: name, dtype, shape) to `path`; returns it."""
    path = Path(path)
    header: dict[str, object] = {"__metadata__": dict(metadata or {})}
    offset = 0
    for name, dtype, shape in specs:
        n = math.prod(shape) * torch.empty(0, dtype=dtype).element_size()
        header[name] = {"dtype": DTYPES[dtype], "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(len(raw).to_bytes(8, "little"))
            f.write(raw)
            for (_name, dtype, shape), t in zip(specs, tensors, strict=True):
                t = t.detach().to("cpu", dtype).reshape(shape).contiguous()
                f.write(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def export_engine(engine: Any, path: Path, dtypes: dict[str, torch.dtype] | None = None) -> Path:
    """An `engine.OffloadEngine`'s weights (`engine.weights()`): trainable ones from their fp32 master (streamed
    through the optimizer-state cache), frozen ones from their compute copy; in `dtypes[name]`, default fp32
    for trainable and the compute dtype for frozen tensors. With several ranks every rank streams and rank 0
    (`engine.writes_files`) writes the one consolidated file."""
    dtypes = dtypes or {}
    entries = engine.store.entries
    specs = [(e.name, dtypes.get(e.name, torch.float32 if e.trainable else e.dtype), tuple(e.shape)) for e in entries]
    values = (value for _, value in engine.weights())
    if not engine.writes_files:
        for _ in values:  # each tensor goes from its owner to rank 0
            pass
        return Path(path)
    return write_safetensors(path, specs, values, {"format": "pt", "producer": "tencache"})
