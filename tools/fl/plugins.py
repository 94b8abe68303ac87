"""Your own model and data: `package.module:attribute` targets, imported and checked before a job starts.

`--model pkg.mod:factory`: factory(num_features, num_classes) returns a torch nn.Module; its
state_dict travels as raw numpy buffers (core.rpc_codec, never pickle), and a client whose model
has other names or shapes is refused at registration.
`--dataset pkg.mod:loader` (experiments: `simulate` and `partition`): loader(num_clients, seed) returns
(x, y) or (x, y, client_of): x a 2-D float array (one row per sample; a model may reshape it), y integer
labels 0..C-1, and optionally client_of, the client id of every sample (your partition; without it the
job's partition option applies). It must be deterministic for its arguments.
A real client's own data (`fl-client run --data`) is local_data.py's. Whatever user code raises becomes
one UserCodeError line naming the flag and target (call_user); -v shows its traceback.
"""
from __future__ import annotations

import importlib
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np

from mlsyskit.core.errors import RuntimeFailure


class PluginError(ValueError):
    """A --model or --dataset target that cannot be used (a usage error: fix the flag or the code it names)."""


class UserCodeError(RuntimeFailure):
    """The code a --model/--data/--dataset target names raised (exit 1); `details` is its traceback (-v)."""

    def __init__(self, message: str, details: str = "") -> None:
        super().__init__(message)
        self.details = details


def call_user(fn: Callable[..., Any], label: str, *args: Any, **kwargs: Any) -> Any:
    """Call user code; anything it raises becomes one UserCodeError line naming `label` (the flag and target)."""
    try:
        return fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 (user code may raise anything; the traceback stays in `details`)
        raise UserCodeError(f"{label} raised {type(e).__name__}: {e}", traceback.format_exc()) from None


def is_target(name: str) -> bool:
    return ":" in name


def load_object(target: str, what: str) -> Callable[..., Any]:
    module_name, sep, attribute = target.partition(":")
    if not sep or not module_name or not attribute:
        raise PluginError(f"{what} must be package.module:name, got {target!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise PluginError(f"{what} {target!r}: cannot import {module_name} ({exc})") from None
    except Exception as exc:  # noqa: BLE001 (importing runs the module's own code)
        raise UserCodeError(f"{what} {target!r}: importing {module_name} raised {type(exc).__name__}: {exc}",
                            traceback.format_exc()) from None
    obj = module
    for part in attribute.split("."):
        if not hasattr(obj, part):
            raise PluginError(f"{what} {target!r}: {module_name} has no attribute {attribute!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise PluginError(f"{what} {target!r} is a {type(obj).__name__}, not a callable")
    return obj


def load_dataset(target: str, num_clients: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Call a dataset loader and check what it returned: (x float32 2-D, y int64, client_of int64 or None)."""
    out = call_user(load_object(target, "--dataset"), f"--dataset {target!r}", num_clients=num_clients, seed=seed)
    if not isinstance(out, tuple) or len(out) not in (2, 3):
        raise PluginError(f"--dataset {target!r} must return (x, y) or (x, y, client_of), got {type(out).__name__}")
    x, y = np.asarray(out[0]), np.asarray(out[1])
    if x.ndim != 2 or y.ndim != 1 or len(x) != len(y) or len(y) == 0:
        raise PluginError(f"--dataset {target!r}: x must be (samples, features) and y (samples,), got x {x.shape} "
                          f"and y {y.shape}")
    if not np.issubdtype(x.dtype, np.number) or not np.isfinite(x).all():
        raise PluginError(f"--dataset {target!r}: x must be finite numbers")
    if not np.issubdtype(y.dtype, np.integer) or y.min() < 0 or len(np.unique(y)) < 2:
        raise PluginError(f"--dataset {target!r}: y must be integer labels 0..C-1 with at least 2 classes")
    client_of = None
    if len(out) == 3:
        client_of = np.asarray(out[2])
        if client_of.shape != y.shape or not np.issubdtype(client_of.dtype, np.integer) \
                or client_of.min() < 0 or client_of.max() >= num_clients:
            raise PluginError(f"--dataset {target!r}: client_of must give every sample a client id in "
                              f"0..{num_clients - 1}")
    return x.astype(np.float32), y.astype(np.int64), None if client_of is None else client_of.astype(np.int64)
