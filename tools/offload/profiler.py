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
                "size_distribution": {str(k): v for k, v in self.size_distribution.items()}, "rows": self.rows}

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
                       tensors=[TensorInfo(t["idx"], t["name"], tuple(t["shape"]), t["dtype"], t["nbytes"])
                                for t in data["tensors"]],
                       uses=[Use(u["module"], u["phase"], tuple(u["tensors"])) for u in data["uses"]],
                       optimizer_order=list(data["optimizer_order"]), rows=data.get("rows", []))
        except (KeyError, TypeError) as e:
            raise ProfileError(f"{path}: malformed profile ({e})") from None


def model_signature(model: nn.Module) -> str:
    h = hashlib.sha256()
    for name, p in model.named_parameters():
        h.update(f"{name}:{tuple(p.shape)}:{p.dtype};".encode())
    return h.hexdigest()


def param_modules(model: nn.Module) -> list[tuple[str, nn.Module, list[tuple[str, nn.Parameter]]]]:
    """Modules that directly own parameters, with their (full name, parameter) pairs."""
    out = []
    for mname, module in model.named_modules():
        params = [(f"{mname}.{n}" if mname else n, p) for n, p in module.named_parameters(recurse=False)]
        if params:
            out.append((mname, module, params))
    return out


def tensor_infos(model: nn.Module) -> list[TensorInfo]:
    return [TensorInfo(i, name, tuple(p.shape), str(p.dtype).removeprefix("torch."), p.numel() * p.element_size())
            for i, (name, p) in enumerate(model.named_parameters())]


def profile_model(model: nn.Module, run_step: Callable[[], torch.Tensor], *, model_name: str, batch: int,
                  seq: int, clock: Callable[[], float] = time.perf_counter) -> Profile:
    """Run one forward+backward (`run_step` returns the loss) with recording hooks, then remove them."""
    infos = tensor_infos(model)
    index = {name: t.idx for name, t in zip((n for n, _ in model.named_parameters()), infos, strict=True)}
    rows: list[dict[str, Any]] = []
    uses: list[Use] = []
    grad_order: list[int] = []
    open_rows: dict[tuple[str, str], list[dict[str, Any]]] = {}
    handles = []

    def start(mname: str, phase: str, params: list[tuple[str, nn.Parameter]]) -> None:
        ids = tuple(index[n] for n, _ in params)
        uses.append(Use(mname, phase, ids))
        t = clock()
        new = [{"idx": index[n], "name": n, "module": mname, "phase": phase, "bytes": infos[index[n]].nbytes,
                "dtype": infos[index[n]].dtype, "start": t, "end": None} for n, _ in params]
        rows.extend(new)
        open_rows[(mname, phase)] = new

    def end(mname: str, phase: str) -> None:
        t = clock()
        for row in open_rows.pop((mname, phase), []):
            row["end"] = t

    for mname, module, params in param_modules(model):
        handles.append(module.register_forward_pre_hook(lambda m, a, n=mname, p=params: start(n, "forward", p)))
        handles.append(module.register_forward_hook(lambda m, a, o, n=mname: end(n, "forward")))
        handles.append(module.register_full_backward_pre_hook(lambda m, g, n=mname, p=params: start(n, "backward", p)))
        for pname, p in params:
            def on_grad(_p: torch.Tensor, pname: str = pname, mname: str = mname) -> None:
                grad_order.append(index[pname])
                t = clock()
                for row in open_rows.get((mname, "backward"), []):
                    if row["name"] == pname:
                        row["end"] = t
            handles.append(p.register_post_accumulate_grad_hook(on_grad))
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Full backward hook is firing")
            loss = run_step()
            loss.backward()
    finally:
        for h in handles:
            h.remove()
    for p in model.parameters():
        p.grad = None
    t0 = min((r["start"] for r in rows), default=0.0)
    for r in rows:
        r["start"] -= t0
        r["end"] = (r["end"] if r["end"] is not None else r["start"] + t0) - t0
    missing = [t.name for t in infos if t.idx not in set(grad_order)]
    if missing:
        raise ProfileError(f"no gradient reached {len(missing)} parameters (e.g. {missing[0]}): is every "
                           f"parameter used in the loss?")
    return Profile(model_name, model_signature(model), batch, seq, infos, uses, grad_order, rows)
