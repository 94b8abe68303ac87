import json
import math

import pytest

from mlsyskit.core.clock import VirtualClock
from mlsyskit.core.telemetry import (
    SCHEMA_VERSION,
    GpuSampler,
    Histogram,
    ProcessSampler,
    Telemetry,
    read_events,
)


def test_event_log_lines_carry_schema_run_seq_and_clock_time(tmp_path):
    clock = VirtualClock()
    path = tmp_path / "sub" / "events.jsonl"
    with Telemetry(clock=clock, log_path=path, run_id="r1") as tel:
        tel.event("start", model="gpt")
        clock.advance(2.5)
        tel.event("step", loss=1.25)
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert lines == [
        {"schema": SCHEMA_VERSION, "run_id": "r1", "seq": 0, "t": 0.0, "kind": "start", "model": "gpt"},
        {"schema": SCHEMA_VERSION, "run_id": "r1", "seq": 1, "t": 2.5, "kind": "step", "loss": 1.25},
    ]
    assert read_events(path)[1]["loss"] == 1.25


def test_read_events_rejects_other_schema(tmp_path):
    p = tmp_path / "e.jsonl"
    p.write_text(json.dumps({"schema": 99, "kind": "x"}) + "\n")
    with pytest.raises(ValueError, match="schema"):
        read_events(p)


def test_histogram_percentiles_nearest_rank():
    h = Histogram()
    for v in reversed(range(1, 101)):
        h.observe(v)
    assert (h.percentile(50), h.percentile(90), h.percentile(99), h.percentile(100)) == (50, 90, 99, 100)
    assert h.stats()["mean"] == 50.5
    assert math.isnan(Histogram().percentile(50))
    with pytest.raises(ValueError):
        h.percentile(101)


def test_counters_summary_and_table():
    tel = Telemetry(run_id="x")
    tel.count("bytes", 10)
    tel.count("bytes", 5)
    tel.observe("lat", 1.0)
    tel.observe("lat", 3.0)
    s = tel.summary()
    assert s["counters"] == {"bytes": 15}
    assert s["histograms"]["lat"]["p50"] == 1.0 and s["histograms"]["lat"]["max"] == 3.0
    from rich.console import Console

    console = Console(record=True, width=120)
    console.print(tel.summary_table("t"))
    text = console.export_text()
    assert "bytes" in text and "15" in text and "lat" in text


def test_samplers():
    sample = ProcessSampler().sample()
    assert sample["rss_bytes"] > 0
    gpu = GpuSampler()
    assert isinstance(gpu.sample(), list)
    if not gpu.available:
        assert gpu.sample() == []
