"""What the transport's CPU cuts must keep: the client's host-CPU reading equals psutil's, and the server's
held-back round lines keep their order and are all printed."""
from __future__ import annotations

import logging

import psutil

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


def test_held_round_lines_keep_their_order_and_all_print(caplog) -> None:
    held = HeldBack(logging.getLogger("mlsyskit.test.held"))
    with caplog.at_level(logging.INFO, logger="mlsyskit.test.held"):
        held.info("round %d: paid %s", 1, "nobody")  # not holding: printed at once
        assert caplog.messages == ["round 1: paid nobody"]
        held.hold()
        held.info("round %d: paid %s", 2, "0: 0.5")
        held.hold()  # holding already: nothing lost
        held.info("round %d: selected %s", 3, [0, 1])
        assert caplog.messages == ["round 1: paid nobody"]
        held.release()
        held.release()  # nothing held: nothing printed twice
    assert caplog.messages == ["round 1: paid nobody", "round 2: paid 0: 0.5", "round 3: selected [0, 1]"]
