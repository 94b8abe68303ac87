"""Per-feature standardisation of a party's own data with the statistics of the server's root set.

Your own data arrive as they are: a CSV of raw measurements has one feature in the thousands and
another in thousandths, and a network trained by SGD on such inputs learns nothing (scikit-learn's
wine data, 3 clients, 10 rounds: chance accuracy for FedAvg and TIFF alike; standardized: 1.0).
The server's root (validation) set is the sample of the task's distribution that every party
trusts (FLTrust's root dataset), so its per-feature mean and standard deviation are the job's: the
server scales its own sets with them and sends the two vectors with the task, and each client
scales its own data with the same vectors (it sends nothing back about its data). A feature that
is constant in the root set is only shifted. `simulate` scales a package.module:loader dataset the
same way (with its validation split) and runs the built-in datasets as prepared; `fl-server run`
cannot tell prepared data from raw, so it scales whatever its root set is (`DataSpec.input_scaling`).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

SCALINGS = ("standardize", "none")
_WIRE = ("input_shift", "input_scale")


@dataclass(frozen=True)
class InputScaling:
    """x -> (x - shift) / scale, per feature, in float32 (the same vectors on every party)."""

    shift: np.ndarray
    scale: np.ndarray

    @classmethod
    def of(cls, x: np.ndarray) -> InputScaling:
        """The per-feature mean and standard deviation of x (samples x features)."""
        x64 = np.asarray(x, dtype=np.float64)
        mean, std = x64.mean(axis=0), x64.std(axis=0)
        constant = std <= 1e-12 * np.maximum(1.0, np.abs(mean))
        return cls(mean.astype(np.float32), np.where(constant, 1.0, std).astype(np.float32))

    def apply(self, x: np.ndarray) -> np.ndarray:
        if x.ndim != 2 or x.shape[1] != len(self.shift):
            raise ValueError(f"input scaling is for {len(self.shift)} features, the data have shape {x.shape}")
        return ((x - self.shift) / self.scale).astype(np.float32)

    def applied_to(self, data: Any) -> Any:
        """A ClientData (or any dataclass with x_train and x_test) with both splits scaled."""
        return dataclasses.replace(data, x_train=self.apply(data.x_train), x_test=self.apply(data.x_test))

    def to_task(self) -> dict[str, list[float]]:
        return {"input_shift": self.shift.tolist(), "input_scale": self.scale.tolist()}

    @classmethod
    def from_task(cls, task: dict, num_features: int) -> InputScaling | None:
        """The scaling a server's task names (None when it names none); ValueError when it is malformed."""
        if not any(key in task for key in _WIRE):
            return None
        try:
            shift, scale = (np.asarray(task[key], dtype=np.float32) for key in _WIRE)
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"the server's input scaling is malformed ({e})") from None
        if shift.shape != (num_features,) or scale.shape != (num_features,) or not np.isfinite(shift).all() \
                or not (np.isfinite(scale) & (scale > 0)).all():
            raise ValueError(f"the server's input scaling is not {num_features} finite shifts and positive scales")
        return cls(shift, scale)


def standardizer(x_root: np.ndarray, mode: str) -> InputScaling | None:
    """The job's scaling from the server's root set: `standardize` or `none`."""
    if mode not in SCALINGS:
        raise ValueError(f"input_scaling must be one of {', '.join(SCALINGS)}, got {mode!r}")
    return InputScaling.of(x_root) if mode == "standardize" else None
