"""Profiling (the warm-up step): record, for every parameter tensor, where it is used in execution order.

Forward pre/post hooks and backward pre hooks on each module that owns parameters, plus a
post-accumulate-grad hook on each parameter, produce rows (tensor id and name, module, phase, bytes,
dtype, start and end time of the module's use). The rows collapse into the *use order*: the sequence of
(module, phase) uses with the tensors each needs, which the prefetcher walks; `optimizer_order` is the
order in which gradients become ready (the order the CPU optimizer visits tensors); the size
distribution (bytes -> count) sizes the buffer pools. A signature of names, shapes and dtypes ties a
profile to its model so a profile from another model is rejected with a clear message.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import time
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from mlsyskit.tools.offload.tracking import UseTracker

SCHEMA = 1


class ProfileError(ValueError):
    """A profile that is unreadable or recorded for a different model."""


@dataclass(frozen=True)
class TensorInfo:
    idx: int
    name: str
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    trainable: bool = True


@dataclass(frozen=True)
class Use:
    module: str
    phase: str  # "forward" | "backward"
    tensors: tuple[int, ...]


@dataclass
class Profile:
    model: str
    signature: str
    batch: int
    seq: int
    tensors: list[TensorInfo]
    uses: list[Use]
    optimizer_order: list[int]
    rows: list[dict[str, Any]] = field(default_factory=list)
    activation_bytes: int = 0  # storages autograd saved for backward in the profiled step (parameters excluded)

    @property
    def size_distribution(self) -> dict[int, int]:
        return dict(sorted(Counter(t.nbytes for t in self.tensors).items()))

    def check_model(self, model: nn.Module, model_name: str | None = None) -> None:
        sig = model_signature(model)
        if sig != self.signature:
            n = sum(1 for _ in model.parameters())
            raise ProfileError(f"the profile was recorded for model {self.model!r} ({len(self.tensors)} tensors, "
                               f"signature {self.signature[:12]}) but this model{' ' + repr(model_name) if model_name else ''}"
                               f" has {n} tensors (signature {sig[:12]}): re-run `tencache profile`")

    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "model": self.model, "signature": self.signature, "batch": self.batch,
                "seq": self.seq, "tensors": [asdict(t) for t in self.tensors],
                "uses": [asdict(u) for u in self.uses], "optimizer_order": self.optimizer_order,
                "size_distribution": {str(k): v for k, v in self.size_distribution.items()}, "rows": self.rows,
                "activation_bytes": self.activation_bytes}

    def save(self, path: str | Path) -> None:
        path = Path(path)
        tmp = path.with_suffix(path.suffix + ".tmp")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)  # as --log and --plot do
            tmp.write_text(json.dumps(self.to_json()))
            tmp.replace(path)
        except OSError as e:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            raise ProfileError(f"cannot write profile {path}: {e.strerror or e}") from None

    @classmethod
    def load(cls, path: str | Path) -> Profile:
        try:
            data = json.loads(Path(path).read_text())
        except FileNotFoundError:
            raise ProfileError(f"profile {path} does not exist") from None
        except (OSError, json.JSONDecodeError) as e:
            raise ProfileError(f"profile {path} is not readable JSON: {e}") from None
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            raise ProfileError(f"{path} is not a tencache profile (schema {SCHEMA})")
        try:
            return cls(model=data["model"], signature=data["signature"], batch=data["batch"], seq=data["seq"],
                       tensors=[TensorInfo(t["idx"], t["name"], tuple(t["shape"]), t["dtype"], t["nbytes"],
                                           t.get("trainable", True))
                                for t in data["tensors"]],
                       uses=[Use(u["module"], u["phase"], tuple(u["tensors"])) for u in data["uses"]],
                       optimizer_order=list(data["optimizer_order"]), rows=data.get("rows", []),
                       activation_bytes=int(data.get("activation_bytes", 0)))
        except (KeyError, TypeError) as e:
            raise ProfileError(f"{path}: malformed profile ({e})") from None


def named_tensors(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """Each distinct Parameter once, under its first name (a tied weight is one tensor)."""
    return list(model.named_parameters())


def model_signature(model: nn.Module) -> str:
    h = hashlib.sha256()
    for name, p in named_tensors(model):
        h.update(f"{name}:{tuple(p.shape)}:{p.dtype}:{p.requires_grad};".encode())
    return h.hexdigest()


def tensor_infos(model: nn.Module) -> list[TensorInfo]:
    return [TensorInfo(i, name, tuple(p.shape), str(p.dtype).removeprefix("torch."), p.numel() * p.element_size(),
                       p.requires_grad)
            for i, (name, p) in enumerate(named_tensors(model))]


@dataclass(eq=False)
class _Tensor:
    idx: int
    name: str
    param: nn.Parameter
    trainable: bool
    nbytes: int
    dtype: str


class _Recorder:
    """Tracker host that records uses instead of moving bytes."""

    def __init__(self, clock: Callable[[], float], progress: Any = None) -> None:
        self.clock = clock
        self.progress = progress
        self.uses: list[Use] = []
        self.rows: list[dict[str, Any]] = []
        self.grad_order: list[int] = []
        self.open: dict[int, list[dict[str, Any]]] = {}

    def acquire(self, label: str, phase: str, entries: list[_Tensor]) -> None:
        self.uses.append(Use(label, phase, tuple(e.idx for e in entries)))
        if self.progress is not None:
            self.progress.set("profiling: {} module uses recorded ({})", len(self.uses), phase)
        t = self.clock()
        for e in entries:
            row = {"idx": e.idx, "name": e.name, "module": label, "phase": phase, "bytes": e.nbytes,
                   "dtype": e.dtype, "start": t, "end": None}
            self.rows.append(row)
            self.open.setdefault(e.idx, []).append(row)

    def release(self, entries: list[_Tensor]) -> None:
        t = self.clock()
        for e in entries:
            for row in self.open.pop(e.idx, []):
                row["end"] = t

    def grad_ready(self, e: _Tensor) -> None:
        self.grad_order.append(e.idx)
        e.param.grad = None  # recorded; dropping it keeps profiling from holding a gradient per parameter

    def updated(self, e: _Tensor) -> bool:
        return False


def profile_model(model: nn.Module, run_step: Callable[[], torch.Tensor], *, model_name: str, batch: int,
                  seq: int, clock: Callable[[], float] = time.perf_counter, progress: Any = None) -> Profile:
    """Run one forward+backward (`run_step` returns the loss) with the use tracker recording, then remove it."""
    infos = tensor_infos(model)
    tensors = [_Tensor(t.idx, t.name, p, p.requires_grad, t.nbytes, t.dtype)
               for t, (_, p) in zip(infos, named_tensors(model), strict=True)]
    rec = _Recorder(clock, progress)  # progress: a progress.ProgressNote
    tracker = UseTracker(model, tensors, rec)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Full backward hook is firing")
            tracker.begin_forward()
            try:
                loss = run_step()
            finally:
                tracker.end_forward()
            loss.backward()
            tracker.end_backward()
    finally:
        tracker.remove()
    for p in model.parameters():
        p.grad = None
    rows = rec.rows
    t0 = min((r["start"] for r in rows), default=0.0)
    for r in rows:
        r["end"] = (r["end"] if r["end"] is not None else r["start"]) - t0
        r["start"] -= t0
    got = set(rec.grad_order)
    missing = [t.name for t in infos if t.trainable and t.idx not in got]
    if missing:
        raise ProfileError(f"no gradient reached {len(missing)} trainable parameters (e.g. {missing[0]}): is "
                           f"every parameter used in the loss? (freeze unused ones with requires_grad=False)")
    return Profile(model_name, model_signature(model), batch, seq, infos, rec.uses, rec.grad_order, rows,
                   activation_bytes=tracker.peak_saved_bytes)
