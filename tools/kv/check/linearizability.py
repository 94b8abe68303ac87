"""Linearizability per key: the Wing-Gong-Lowe search with memoisation, as Porcupine does it.

A history is linearizable when every operation can be given a point between its invoke and
its return such that the operations, in that order, are legal for a single register. Keys
are independent registers, so each key is checked alone (P-compositionality), which keeps
10k-operation histories fast. `info` operations (outcome unknown) return at infinity: they
may take effect at any time after their invoke, or not at all (an unapplied write placed
after everything else changes nothing observable). `fail` operations never happened and
are dropped, as are reads whose outcome is unknown.

The search walks the events in time order and linearizes a call when the model allows it;
at a return whose call is not linearized yet it backtracks. A cache of (linearized set,
state) pairs prunes configurations already explored (Lowe's improvement), and a step budget
turns a pathological search into an explicit "unknown" instead of a hang.
"""
from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

from mlsyskit.tools.kv.check.model import UNKNOWN, Op, step
from mlsyskit.tools.kv.client.history import History, HistoryFormatError


def operations(history: History) -> dict[str, list[Op]]:
    """Pair each process's invoke with its completion; group the operations that matter by key."""
    open_calls: dict[int, tuple] = {}
    by_key: dict[str, list[Op]] = defaultdict(list)
    next_id = 0

    def add(call, kind: str, completion) -> None:
        nonlocal next_id
        f, key, arg, t0 = call.f, call.key, call.value, call.time
        if kind == "fail" or (kind == "info" and f in ("get", "exists")):
            return  # never happened, or a read whose answer nobody saw: no constraint
        if kind == "ok":
            result = arg if f == "put" else completion.value
            if f == "del" and result is None:
                result = UNKNOWN  # recorded without the existed flag
            op = Op(next_id, call.process, f, key, arg if f == "put" else None, result, t0, completion.time, True,
                    completion.node)
        else:
            op = Op(next_id, call.process, f, key, arg if f == "put" else None, UNKNOWN, t0, math.inf, False)
        next_id += 1
        by_key[key].append(op)

    for e in history.events:
        if e.type == "invoke":
            if e.process in open_calls:
                raise HistoryFormatError(f"process {e.process} invoked twice without completing (t={e.time})")
            open_calls[e.process] = e
            continue
        call = open_calls.pop(e.process, None)
        if call is None:
            raise HistoryFormatError(f"process {e.process} completed an operation it never invoked (t={e.time})")
        if (call.f, call.key) != (e.f, e.key):
            raise HistoryFormatError(f"process {e.process}: completion {e.f} {e.key!r} does not match its "
                                     f"invoke {call.f} {call.key!r}")
        add(call, e.type, e)
    for call in open_calls.values():  # never completed: outcome unknown
        add(call, "info", None)
    return dict(by_key)


class _Entry:
    __slots__ = ("op", "is_call", "match", "prev", "next")

    def __init__(self, op: Op | None, is_call: bool) -> None:
        self.op, self.is_call = op, is_call
        self.match: _Entry | None = None
        self.prev: _Entry | None = None
        self.next: _Entry | None = None


@dataclass
class KeyResult:
    key: str
    ops: int
    linearizable: bool | None  # None: the step budget ran out
    steps: int = 0
    blocking: Op | None = None  # the operation no linearization could get past
    concurrent: list[Op] = field(default_factory=list)  # what overlapped it, for the report
    last_state: str | None = None  # register state of the deepest partial linearization

    def explain(self, limit: int = 12) -> list[str]:
        if self.linearizable is not False or self.blocking is None:
            return []
        lines = [f"key {self.key!r}: no linearization gets past {self.blocking.describe()} "
                 f"(value before it could at best be {self.last_state!r})"]
        lines += ["  concurrent/preceding: " + op.describe() for op in self.concurrent[:limit]]
        return lines


def _build(ops: list[Op]) -> _Entry:
    events: list[tuple[float, int, _Entry]] = []
    for op in ops:
        call, ret = _Entry(op, True), _Entry(op, False)
        call.match = ret
        events.append((op.call, 0, call))  # calls before returns at equal times: the permissive order
        events.append((op.ret, 1, ret))
    events.sort(key=lambda t: (t[0], t[1], t[2].op.id))
    head = _Entry(None, False)
    prev = head
    for _, _, entry in events:
        prev.next, entry.prev = entry, prev
        prev = entry
    return head


def _lift(entry: _Entry) -> None:
    entry.prev.next = entry.next
    if entry.next is not None:
        entry.next.prev = entry.prev
    ret = entry.match
    ret.prev.next = ret.next
    if ret.next is not None:
        ret.next.prev = ret.prev


def _unlift(entry: _Entry) -> None:
    ret = entry.match
    ret.prev.next = ret
    if ret.next is not None:
        ret.next.prev = ret
    entry.prev.next = entry
    if entry.next is not None:
        entry.next.prev = entry


def check_key(key: str, ops: list[Op], budget: int = 2_000_000) -> KeyResult:
    """Wing-Gong-Lowe search over one key's operations; the initial state is 'absent'."""
    ids = {op.id: i for i, op in enumerate(ops)}  # dense bit positions
    head = _build(ops)
    definite_left = sum(op.definite for op in ops)
    state: str | None = None
    linearized = 0
    cache: set[tuple[int, str | None]] = set()
    stack: list[tuple[_Entry, str | None]] = []
    entry = head.next
    steps = 0
    best_depth, blocking, best_state = -1, None, None
    while definite_left:  # what remains are info ops, placeable at the end where they change nothing
        steps += 1
        if steps > budget:
            return KeyResult(key, len(ops), None, steps)
        if entry.is_call:
            legal, new_state = step(state, entry.op)
            if legal:
                bits = linearized | (1 << ids[entry.op.id])
                if (bits, new_state) not in cache:
                    cache.add((bits, new_state))
                    stack.append((entry, state))
                    state, linearized = new_state, bits
                    definite_left -= entry.op.definite
                    _lift(entry)
                    entry = head.next
                    continue
            entry = entry.next
            continue
        # a return whose call is not linearized: undo the latest choice and try the next call
        if len(stack) > best_depth:
            best_depth, blocking, best_state = len(stack), entry.op, state
        if not stack:
            return _failure(key, ops, steps, blocking, best_state)
        entry, state = stack.pop()
        linearized &= ~(1 << ids[entry.op.id])
        definite_left += entry.op.definite
        _unlift(entry)
        entry = entry.next
    return KeyResult(key, len(ops), True, steps)


def _failure(key: str, ops: list[Op], steps: int, blocking: Op, state: str | None) -> KeyResult:
    window = [op for op in ops if op.id != blocking.id and op.call <= blocking.ret and op.ret >= blocking.call - 1.0]
    window.sort(key=lambda op: op.call)
    return KeyResult(key, len(ops), False, steps, blocking, window, state)


@dataclass
class Report:
    keys: int
    ops: int
    results: list[KeyResult]

    @property
    def violations(self) -> list[KeyResult]:
        return [r for r in self.results if r.linearizable is False]

    @property
    def unknown(self) -> list[KeyResult]:
        return [r for r in self.results if r.linearizable is None]

    @property
    def linearizable(self) -> bool | None:
        if self.violations:
            return False
        return None if self.unknown else True


def check_history(history: History, budget_per_key: int = 2_000_000) -> Report:
    by_key = operations(history)
    results = [check_key(key, ops, budget_per_key) for key, ops in sorted(by_key.items())]
    return Report(len(by_key), sum(len(v) for v in by_key.values()), results)
