"""Client availability as an on/off process per client, in FedScale's trace schema.

FedScale's client behaviour trace maps a client key to
    {"active": [t0, t1, ...], "inactive": [u0, u1, ...], "finish_time": T, ...}
where the client is online during [active[i], inactive[i]] and the pattern repeats every T
seconds (FedScale's `Client.isActive` takes `now % finish_time`). Client id c uses the trace of
the (c mod n)-th key, as FedScale's client manager does. A real trace drops in through
`load_trace` (JSON in that schema, or FedScale's pickle through an unpickler that only builds
dicts, lists and numbers). `SyntheticAvailability` makes the same schema per client, lazily, from
a seed: alternating exponential on/off periods.
"""
from __future__ import annotations

import bisect
import io
import json
import pickle
import random
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol

from mlsyskit.core.config import ConfigError, require
from mlsyskit.core.sim import sub_seed


@dataclass(frozen=True)
class OnOffTrace:
    active: tuple[float, ...]
    inactive: tuple[float, ...]
    finish_time: float

    def __post_init__(self) -> None:
        require(len(self.active) == len(self.inactive) and self.active, "a trace needs paired active/inactive times")
        require(self.finish_time > 0, "finish_time must be positive")
        previous_end = -1.0
        for start, end in zip(self.active, self.inactive, strict=True):
            require(previous_end < start <= end, "trace intervals must be ordered and not overlap")
            previous_end = end
        require(self.inactive[-1] <= self.finish_time, "trace intervals must end by finish_time")

    def _interval(self, now_s: float) -> int | None:
        t = now_s % self.finish_time
        i = bisect.bisect_right(self.active, t) - 1
        return i if i >= 0 and t <= self.inactive[i] else None

    def is_active(self, now_s: float) -> bool:
        return self._interval(now_s) is not None

    def online_until(self, now_s: float) -> float:
        """When the current online interval ends (now_s itself when offline)."""
        i = self._interval(now_s)
        if i is None:
            return now_s
        return now_s + (self.inactive[i] - now_s % self.finish_time)


class Availability(Protocol):
    def is_active(self, client_id: int, now_s: float) -> bool: ...

    def online_until(self, client_id: int, now_s: float) -> float: ...


class AlwaysAvailable:
    def is_active(self, client_id: int, now_s: float) -> bool:
        return True

    def online_until(self, client_id: int, now_s: float) -> float:
        return float("inf")


class TraceAvailability:
    """Availability from a loaded trace; client c follows the trace of key number c mod n."""

    def __init__(self, traces: Mapping[Any, OnOffTrace]) -> None:
        require(bool(traces), "an availability trace needs at least one client")
        self._traces = [traces[key] for key in sorted(traces, key=str)]

    def trace(self, client_id: int) -> OnOffTrace:
        return self._traces[client_id % len(self._traces)]

    def is_active(self, client_id: int, now_s: float) -> bool:
        return self.trace(client_id).is_active(now_s)

    def online_until(self, client_id: int, now_s: float) -> float:
        return self.trace(client_id).online_until(now_s)


class SyntheticAvailability:
    """Per-client on/off traces made on demand: exponential on and off periods over `horizon_s`.

    `always_on_fraction` of clients never go offline (plugged-in devices); the rest start in a
    random phase. Each trace depends only on (seed, client id).
    """

    def __init__(self, seed: int, *, mean_on_s: float = 1800.0, mean_off_s: float = 600.0,
                 horizon_s: float = 86400.0, always_on_fraction: float = 0.0,
                 cache_size: int = 4096) -> None:
        require(mean_on_s > 0 and mean_off_s > 0 and horizon_s > 0, "on/off means and horizon must be positive")
        require(0 <= always_on_fraction <= 1, "always_on_fraction must be in [0, 1]")
        self.seed, self.mean_on_s, self.mean_off_s = seed, mean_on_s, mean_off_s
        self.horizon_s, self.always_on_fraction = horizon_s, always_on_fraction
        self.trace = lru_cache(maxsize=cache_size)(self._make_trace)  # bounded: 100k clients stay cheap

    def _make_trace(self, client_id: int) -> OnOffTrace:
        rng = random.Random(sub_seed(self.seed, f"fl-sched/availability/{client_id}"))
        if rng.random() < self.always_on_fraction:
            return OnOffTrace((0.0,), (self.horizon_s,), self.horizon_s)
        active, inactive = [], []
        t = rng.uniform(0, self.mean_off_s) if rng.random() < 0.5 else 0.0  # random phase
        while t < self.horizon_s:
            end = min(t + rng.expovariate(1 / self.mean_on_s), self.horizon_s)
            active.append(t)
            inactive.append(end)
            t = end + max(rng.expovariate(1 / self.mean_off_s), 1e-3)
        return OnOffTrace(tuple(active), tuple(inactive), self.horizon_s)

    def is_active(self, client_id: int, now_s: float) -> bool:
        return self.trace(client_id).is_active(now_s)

    def online_until(self, client_id: int, now_s: float) -> float:
        return self.trace(client_id).online_until(now_s)


class _DataOnlyUnpickler(pickle.Unpickler):
    """FedScale ships its trace as a pickle; a pickle can run code, so build no object but data."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"trace pickle refers to {module}.{name}; only dicts, lists and numbers allowed")


def parse_trace(raw: Any) -> dict[str, OnOffTrace]:
    if not isinstance(raw, dict) or not raw:
        raise ConfigError("availability trace must be a non-empty mapping of client -> {active, inactive, finish_time}")
    out = {}
    for key, entry in raw.items():
        try:
            out[str(key)] = OnOffTrace(tuple(float(t) for t in entry["active"]),
                                       tuple(float(t) for t in entry["inactive"]), float(entry["finish_time"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"availability trace entry {key!r}: {exc}") from None
    return out


def load_trace(path: str | Path) -> TraceAvailability:
    """Load a FedScale-schema trace from JSON or from FedScale's pickle (data only)."""
    data = Path(path).read_bytes()
    try:
        raw = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError):
        try:
            raw = _DataOnlyUnpickler(io.BytesIO(data)).load()
        except Exception as exc:  # noqa: BLE001 (any unpickling failure is a bad file)
            raise ConfigError(f"{path}: neither JSON nor a data-only pickle: {exc}") from None
    return TraceAvailability(parse_trace(raw))
