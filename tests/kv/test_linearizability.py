"""The WGL checker on hand-made histories it must accept and histories it must reject."""
from __future__ import annotations

import random
import time

import pytest

from mlsyskit.core.clock import VirtualClock
from mlsyskit.tools.kv.check.linearizability import check_history, check_key, operations
from mlsyskit.tools.kv.check.simulate import SimShard
from mlsyskit.tools.kv.client.history import History, HistoryFormatError


def build(*rows) -> History:
    """rows: (time, process, type, f, value) on key 'k', in time order."""
    clock = VirtualClock()
    h = History(clock)
    for t, p, kind, f, value in rows:
        clock.set(t)
        if kind == "invoke":
            h.invoke(p, f, b"k", value)
        else:
            h.complete(p, kind, f, b"k", value)
    return h


def verdict(h: History) -> bool | None:
    return check_history(h).linearizable


def test_sequential_history_is_linearizable() -> None:
    h = build((0, 0, "invoke", "put", b"a"), (1, 0, "ok", "put", b"a"),
              (2, 1, "invoke", "get", None), (3, 1, "ok", "get", b"a"),
              (4, 0, "invoke", "del", None), (5, 0, "ok", "del", "1"),
              (6, 1, "invoke", "get", None), (7, 1, "ok", "get", None),
              (8, 1, "invoke", "exists", None), (9, 1, "ok", "exists", "0"))
    assert verdict(h) is True


def test_stale_read_after_acknowledged_write_is_rejected() -> None:
    h = build((0, 0, "invoke", "put", b"a"), (1, 0, "ok", "put", b"a"),
              (2, 0, "invoke", "put", b"b"), (3, 0, "ok", "put", b"b"),
              (4, 1, "invoke", "get", None), (5, 1, "ok", "get", b"a"))
    report = check_history(h)
    assert report.linearizable is False
    [bad] = report.violations
    assert bad.blocking.f == "get" and bad.blocking.result == "a"
    assert any("no linearization gets past" in line for line in bad.explain())


def test_read_of_nothing_after_acknowledged_write_is_rejected() -> None:
    h = build((0, 0, "invoke", "put", b"a"), (1, 0, "ok", "put", b"a"),
              (2, 1, "invoke", "get", None), (3, 1, "ok", "get", None))
    assert verdict(h) is False


def test_concurrent_write_may_be_seen_or_not() -> None:
    for seen in (b"a", None):
        h = build((0, 0, "invoke", "put", b"a"), (1, 1, "invoke", "get", None),
                  (2, 1, "ok", "get", seen), (3, 0, "ok", "put", b"a"))
        assert verdict(h) is True


def test_new_old_inversion_is_rejected() -> None:
    # A write of b is concurrent with two reads; the first read sees b, the later one a: not linearizable.
    h = build((0, 0, "invoke", "put", b"a"), (1, 0, "ok", "put", b"a"),
              (2, 0, "invoke", "put", b"b"),
              (3, 1, "invoke", "get", None), (4, 1, "ok", "get", b"b"),
              (5, 2, "invoke", "get", None), (6, 2, "ok", "get", b"a"),
              (7, 0, "ok", "put", b"b"))
    assert verdict(h) is False


def test_info_write_may_take_effect_late_or_never() -> None:
    late = build((0, 0, "invoke", "put", b"a"), (1, 0, "info", "put", b"a"),
                 (2, 1, "invoke", "get", None), (3, 1, "ok", "get", None),
                 (4, 1, "invoke", "get", None), (5, 1, "ok", "get", b"a"))
    assert verdict(late) is True
    never = build((0, 0, "invoke", "put", b"a"), (1, 0, "info", "put", b"a"),
                  (2, 1, "invoke", "get", None), (3, 1, "ok", "get", None))
    assert verdict(never) is True
    # ...but not before its invoke
    early = build((0, 1, "invoke", "get", None), (1, 1, "ok", "get", b"a"),
                  (2, 0, "invoke", "put", b"a"), (3, 0, "info", "put", b"a"))
    assert verdict(early) is False


def test_failed_write_never_happened() -> None:
    h = build((0, 0, "invoke", "put", b"a"), (1, 0, "fail", "put", b"a"),
              (2, 1, "invoke", "get", None), (3, 1, "ok", "get", b"a"))
    assert verdict(h) is False


def test_delete_reports_whether_the_key_existed() -> None:
    wrong = build((0, 0, "invoke", "put", b"a"), (1, 0, "ok", "put", b"a"),
                  (2, 0, "invoke", "del", None), (3, 0, "ok", "del", "0"))
    assert verdict(wrong) is False
    h = build((0, 0, "invoke", "del", None), (1, 0, "ok", "del", "0"))
    assert verdict(h) is True


def test_keys_are_checked_independently() -> None:
    clock = VirtualClock()
    h = History(clock)
    for i, (p, kind, f, key, value) in enumerate([
            (0, "invoke", "put", b"x", b"1"), (0, "ok", "put", b"x", b"1"),
            (1, "invoke", "get", b"y", None), (1, "ok", "get", b"y", None),
            (1, "invoke", "get", b"x", None), (1, "ok", "get", b"x", b"2")]):
        clock.set(i)
        (h.invoke(p, f, key, value) if kind == "invoke" else h.complete(p, kind, f, key, value))
    report = check_history(h)
    assert report.keys == 2 and [r.key for r in report.violations] == ["x"]


def test_malformed_histories_are_refused() -> None:
    h = build((0, 0, "invoke", "put", b"a"), (1, 0, "invoke", "put", b"b"))
    with pytest.raises(HistoryFormatError, match="invoked twice"):
        operations(h)
    h = build((0, 0, "ok", "put", b"a"))
    with pytest.raises(HistoryFormatError, match="never invoked"):
        operations(h)


def test_history_round_trips_through_jsonl(tmp_path) -> None:
    h = build((0, 0, "invoke", "put", b"a"), (1, 0, "info", "put", b"a"),
              (2, 1, "invoke", "get", None), (3, 1, "ok", "get", None))
    h.write_jsonl(tmp_path / "h.jsonl")
    back = History.read_jsonl(tmp_path / "h.jsonl")
    assert back.events == h.events
    (tmp_path / "bad.jsonl").write_text('{"process": 0, "type": "maybe", "f": "get", "key": "k", "time": 0}\n')
    with pytest.raises(HistoryFormatError):
        History.read_jsonl(tmp_path / "bad.jsonl")


def random_register_history(seed: int, n_ops: int, processes: int, corrupt: bool) -> History:
    """A history produced by a real sequential register with random overlapping ops.

    Each op takes effect at a random instant inside its [invoke, return] interval, so the
    history is linearizable by construction; `corrupt` turns one read stale afterwards.
    """
    rng = random.Random(seed)
    clock = VirtualClock()
    h = History(clock)
    events = []  # (time, kind, process, f, value)
    t_free = [0.0] * processes
    effects = []
    for i in range(n_ops):
        p = rng.randrange(processes)
        start = t_free[p] + rng.uniform(0, 1)
        end = start + rng.uniform(0.01, 3)
        t_free[p] = end
        f = rng.choice(["put", "put", "get", "get", "del"])
        effects.append((rng.uniform(start, end), i, p, f, start, end))
    value = None
    results = {}
    for _at, i, _p, f, _start, _end in sorted(effects):
        if f == "put":
            value = f"v{i}"
            results[i] = value
        elif f == "get":
            results[i] = value
        else:
            results[i] = "1" if value is not None else "0"
            value = None
    stale_done = False
    for _, i, p, f, start, end in effects:
        arg = f"v{i}" if f == "put" else None
        res = results[i]
        if corrupt and not stale_done and f == "get" and res is not None and i > n_ops // 2:
            res, stale_done = "never-written", True
        events.append((start, "invoke", p, f, arg))
        events.append((end, "ok", p, f, res))
    for t, kind, p, f, value in sorted(events, key=lambda e: e[0]):
        clock.set(t)
        if kind == "invoke":
            h.invoke(p, f, b"k", value.encode() if value else None)
        else:
            h.complete(p, kind, f, b"k", value)
    return h


@pytest.mark.parametrize("seed", range(5))
def test_random_linearizable_histories_are_accepted_and_corrupted_ones_rejected(seed: int) -> None:
    assert verdict(random_register_history(seed, 300, 6, corrupt=False)) is True
    assert verdict(random_register_history(seed, 300, 6, corrupt=True)) is False


def test_ten_thousand_operation_history_is_checked_in_seconds() -> None:
    h = random_register_history(42, 10_000, 10, corrupt=False)
    started = time.process_time()
    assert verdict(h) is True
    # Not a performance assertion (benchmarks own those): a sanity bound far above the ~1 s it takes.
    assert time.process_time() - started < 120


def test_budget_exhaustion_is_unknown_not_a_verdict() -> None:
    h = random_register_history(1, 200, 8, corrupt=False)
    ops = operations(h)["k"]
    assert check_key("k", ops, budget=10).linearizable is None


def test_simulated_chain_replication_is_linearizable() -> None:
    shard = SimShard("ms-sc", replicas=3, seed=3)
    rng = random.Random(3)
    for i in range(200):  # one process per operation: the simulated clients overlap freely
        node = "r0" if i % 2 == 0 else "r2"
        op = "put" if node == "r0" else "get"
        shard.submit(node, op, b"k", b"v%d" % i if op == "put" else None, process=i,
                     delay=i * 2e-4 + rng.uniform(0, 1e-4))
    shard.run()
    report = check_history(shard.history)
    assert report.ops == 200 and report.linearizable is True
