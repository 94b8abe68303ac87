"""What the transport's CPU cuts must keep: the client's host-CPU reading equals psutil's, and the server's
held-back events and round lines keep their order and times and are all written."""
from __future__ import annotations

import logging

import psutil

from mlsyskit.core.clock import VirtualClock
from mlsyskit.core.telemetry import Telemetry, read_events
from mlsyskit.tools.fl import measure
from mlsyskit.tools.fl.measure import Snapshot, Span, host_cpu_seconds
from mlsyskit.tools.fl.server_wire import HeldBack


def _psutil_host() -> tuple[float, float]:
    times = psutil.cpu_times()
    total = sum(times)
    return total - (times.idle + getattr(times, "iowait", 0.0)), total


def test_host_cpu_seconds_is_psutils_count(monkeypatch) -> None:
    before = _psutil_host()
    ours = host_cpu_seconds()
    after = _psutil_host()
    # read between two psutil reads: within them, up to one tick per core of rounding
    slack = 0.02 * (psutil.cpu_count() or 1)
    for i in range(2):
        assert before[i] - slack <= ours[i] <= after[i] + slack
    monkeypatch.setattr(measure._proc_stat, "read", lambda: None)  # no /proc/stat: psutil's own reading
    fallback = host_cpu_seconds()
    assert after[1] <= fallback[1] <= _psutil_host()[1]


def test_span_between_snapshots() -> None:
    span = Span.between(Snapshot(1.0, 0.5, 10.0, 40.0), Snapshot(3.0, 1.5, 13.0, 44.0))
    assert (span.wall_s, span.cpu_s, span.host_cpu_percent, span.cpu_percent) == (2.0, 1.0, 75.0, 50.0)
    assert Span.between(Snapshot(1.0, 0.5, 10.0, 40.0), Snapshot(1.0, 0.5, 10.0, 40.0)).host_cpu_percent == 0.0
    taken = Snapshot.take()
    assert 0 <= taken.host_busy <= taken.host_total


def test_held_events_keep_order_and_time(tmp_path, caplog) -> None:
    clock = VirtualClock()
    telemetry = Telemetry(clock, tmp_path / "events.jsonl")
    held = HeldBack(telemetry, logging.getLogger("mlsyskit.test.held"))
    held.event("join", client=1)  # not holding: written at once
    assert [e["kind"] for e in read_events(tmp_path / "events.jsonl")] == ["join"]
    held.hold()
    clock.advance(2.0)
    held.event("round_end", round=1)
    held.info("round %d: paid %s", 1, "nobody")
    clock.advance(3.0)
    held.event("round_start", round=2)
    assert len(read_events(tmp_path / "events.jsonl")) == 1  # nothing written while held
    clock.advance(4.0)
    with caplog.at_level(logging.INFO, logger="mlsyskit.test.held"):
        held.release()
    events = read_events(tmp_path / "events.jsonl")
    assert [(e["kind"], e["seq"], e["t"]) for e in events] == [("join", 0, 0.0), ("round_end", 1, 2.0),
                                                              ("round_start", 2, 5.0)]
    assert caplog.messages == ["round 1: paid nobody"]
    held.release()  # nothing held: nothing written twice
    held.event("leave", client=1)
    assert [e["kind"] for e in read_events(tmp_path / "events.jsonl")][-1] == "leave"
    assert len(read_events(tmp_path / "events.jsonl")) == 4
    telemetry.close()


def test_held_event_fields_are_kept(tmp_path) -> None:
    telemetry = Telemetry(VirtualClock(), tmp_path / "e.jsonl")
    held = HeldBack(telemetry, logging.getLogger("mlsyskit.test.held"))
    held.hold()
    held.event("round_end", round=3, reports={"0": {"status": "valid"}})
    held.release()
    (event,) = read_events(tmp_path / "e.jsonl")
    assert event["reports"] == {"0": {"status": "valid"}} and event["round"] == 3
    telemetry.close()
