"""The running jobs of a least-attained-service policy in priority order, with prefix sums of the
GPUs each keeps in the admission walk (tiresias.py).

Each decision walks waiting and running jobs in one merged priority order; the walk visits every
running job in most decisions. Here the running jobs' keys sit in a plain sorted list, and
`cum[p]` is the sum of what the first p of them keep (`hold`, the policy's `holds`), so a run of
running jobs between two waiting ones is taken in one step when it fits the capacity left. The
sums stay valid across decisions: a start, preemption, finish, queue crossing or resize at
position p drops only the sums from p on, and the GPUs each job keeps sit in a list beside the
keys until it is touched (so redoing the sums from p is a loop in C, not in Python). The owner
must `touch` a job whenever what `hold` returns for it may change while its key stays (a resize).
"""
from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator
from itertools import accumulate, islice

Key = tuple[int, float, int]   # (queue level, rank inside the queue, job id)


class RunningOrder:
    def __init__(self, hold: Callable[[int], int]) -> None:
        self.keys: list[Key] = []
        self.held: list[int | None] = []   # held[p]: what keys[p] keeps; None until asked (or touched)
        self.cum: list[int] = [0]          # cum[p]: what keys[:p] keep; valid for p < len(cum)
        self._hold = hold                  # job id -> GPUs it keeps in the walk

    def __len__(self) -> int:
        return len(self.keys)

    def __bool__(self) -> bool:
        return bool(self.keys)

    def __iter__(self) -> Iterator[Key]:
        return iter(self.keys)

    def __getitem__(self, i: int) -> Key:
        return self.keys[i]

    def __contains__(self, key: Key) -> bool:
        p = bisect_left(self.keys, key)
        return p < len(self.keys) and self.keys[p] == key

    def _drop_from(self, p: int) -> None:
        if len(self.cum) > p + 1:
            del self.cum[p + 1:]

    def add(self, key: Key) -> None:
        p = bisect_left(self.keys, key)
        self.keys.insert(p, key)
        self.held.insert(p, None)
        self._drop_from(p)

    def discard(self, key: Key) -> None:
        p = bisect_left(self.keys, key)
        if p < len(self.keys) and self.keys[p] == key:
            del self.keys[p]
            del self.held[p]
            self._drop_from(p)

    def touch(self, key: Key) -> None:
        """What the job of `key` keeps may have changed (it was resized)."""
        p = bisect_left(self.keys, key)
        if p < len(self.keys) and self.keys[p] == key:
            self.held[p] = None
        self._drop_from(p)

    def prefix(self, j: int) -> list[int]:
        """`cum`, valid at least up to position j (computing what is missing)."""
        cum = self.cum
        start = len(cum) - 1
        if start < j:
            held = self.held
            if None in held[start:j]:   # jobs started or resized since: ask the policy, in order
                keys, p = self.keys, start
                while (p := _index(held, None, p, j)) >= 0:
                    held[p] = self._hold(keys[p][2])
                    p += 1
            cum.extend(islice(accumulate(held[start:j], initial=cum[-1]), 1, None))
        return cum


def _index(items: list, value, start: int, stop: int) -> int:
    """The first position of `value` in items[start:stop], -1 if none (list.index without raising)."""
    try:
        return items.index(value, start, stop)
    except ValueError:
        return -1
