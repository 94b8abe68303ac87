"""The running jobs of a least-attained-service policy in priority order, with prefix sums of the
GPUs each keeps in the admission walk (tiresias.py).

Each decision walks waiting and running jobs in one merged priority order; the walk visits every
running job in most decisions. Here the running jobs' keys sit in a plain sorted list, and
`cum[p]` is the sum of what the first p of them keep (`hold`, the policy's `holds`), so a run of
running jobs between two waiting ones is taken in one step when it fits the capacity left. The
sums stay valid across decisions: a start, preemption, finish, queue crossing or resize at
position p drops only the sums from p on, and the GPUs a job keeps are remembered per job until
it is touched. The owner must `touch` a job whenever what `hold` returns for it may change while
its key stays (a resize).
"""
from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator
from itertools import accumulate

Key = tuple[int, float, int]   # (queue level, rank inside the queue, job id)


class RunningOrder:
    def __init__(self, hold: Callable[[int], int]) -> None:
        self.keys: list[Key] = []
        self.cum: list[int] = [0]          # cum[p]: what keys[:p] keep; valid for p < len(cum)
        self._hold = hold                  # job id -> GPUs it keeps in the walk
        self._held: dict[int, int] = {}    # job id -> its last `hold`, until touched

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
        self._held.pop(key[2], None)
        self._drop_from(p)

    def discard(self, key: Key) -> None:
        p = bisect_left(self.keys, key)
        if p < len(self.keys) and self.keys[p] == key:
            del self.keys[p]
            self._held.pop(key[2], None)
            self._drop_from(p)

    def touch(self, key: Key) -> None:
        """What the job of `key` keeps may have changed (it was resized)."""
        self._held.pop(key[2], None)
        self._drop_from(bisect_left(self.keys, key))

    def prefix(self, j: int) -> list[int]:
        """`cum`, valid at least up to position j (computing what is missing)."""
        cum = self.cum
        start = len(cum) - 1
        if start < j:
            held, run = self._held, self.keys[start:j]
            values = [held.get(key[2]) for key in run]
            if None in values:   # jobs started or resized since: ask the policy
                for p, key in enumerate(run):
                    if values[p] is None:
                        values[p] = held[key[2]] = self._hold(key[2])
            sums = accumulate(values, initial=cum[-1])
            next(sums)   # the initial value, already there
            cum.extend(sums)
        return cum
