"""`fast` per training sample (HeteroConfig.fast_unit="per-sample"; no preset's default): a client with much data on a fast
device is as fast as a small one on the same device; by plain latency the small one always wins."""
from __future__ import annotations

import random

import pytest

from mlsyskit.core.config import ConfigError
from mlsyskit.tools.fl.outcome import ClientReport, RoundOutcome
from mlsyskit.tools.fl.scheduling.hetero import HeteroConfig, HeteroScheduler

# client -> (samples, seconds a sample): 0-3 hold 100 samples on fast devices, 4-7 hold 5 on slow ones
CLIENTS = {c: (100, 0.01) if c < 4 else (5, 0.1) for c in range(8)}


def observed(unit: str | None, preset: str = "adaptive") -> HeteroScheduler:
    scheduler = HeteroScheduler(HeteroConfig(preset=preset, fast_unit=unit, explore=0.0))
    reports = {c: ClientReport(c, {"num_samples": n, "loss": 1.0, "train_time_s": n * per, "cpu_time_s": n * per})
               for c, (n, per) in CLIENTS.items()}
    scheduler.observe(RoundOutcome(1, sorted(CLIENTS), reports, {"accuracy": 0.3}))
    return scheduler


def test_per_sample_prefers_fast_devices_latency_prefers_small_data():
    # preset fast: adaptive's own cut-off (utility-rate) would tie both groups here
    per_sample, latency = observed("per-sample"), observed("latency", preset="fast")
    assert per_sample.select(2, list(CLIENTS), 4, random.Random(0)) == [0, 1, 2, 3]  # 1 s for 100 samples
    assert latency.select(2, list(CLIENTS), 4, random.Random(0)) == [4, 5, 6, 7]  # 0.5 s for 5 samples
    terms = per_sample.terms(list(CLIENTS), k=1)["fast"]
    assert terms[0] == 1.0 and terms[4] == pytest.approx(0.1)


def test_presets_and_state():
    assert HeteroConfig(preset="adaptive").fast_unit == HeteroConfig(preset="fast").fast_unit == "latency"
    assert HeteroConfig(preset="adaptive", fast_unit="per-sample").fast_unit == "per-sample"
    with pytest.raises(ConfigError):
        HeteroConfig(fast_unit="throughput")
    scheduler = observed("per-sample")
    restored = HeteroScheduler(HeteroConfig(preset="adaptive", fast_unit="per-sample"))
    restored.load_state_dict(scheduler.state_dict())
    assert restored.samples == scheduler.samples == {c: n for c, (n, _) in CLIENTS.items()}
    old = scheduler.state_dict()
    del old["samples"]  # a run saved before sample counts were kept: every client counts as the median one
    restored = HeteroScheduler(HeteroConfig(preset="adaptive", fast_unit="per-sample"))
    restored.load_state_dict(old)
    assert restored.samples == {} and restored.speed_cost([0, 4]) == {0: 1.0, 4: 0.5}
