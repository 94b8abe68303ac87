"""marble's kept envelope steps (policies.marble_goodput): per curve, the best step's answer from k
GPUs within a bound hi, stamped with the curve's estimates when it was scanned."""
from __future__ import annotations


class StepTable:
    """(gain per GPU, size) per curve and (k, hi), with the stamp it was scanned under. Emptied
    before a store once it holds over `limit` answers (`generation` counts that), so it stays
    bounded; `answers` hands one curve's to allocate's fast path (`lookup`)."""

    def __init__(self, limit: int = 100_000) -> None:
        self.limit, self.size, self.generation = limit, 0, 0
        self._by_curve: dict[tuple, dict[tuple[int, int], tuple]] = {}

    def __len__(self) -> int:
        return self.size

    def answers(self, curve: tuple) -> dict[tuple[int, int], tuple] | None:
        """One curve's kept answers as stored (None: none yet), for `lookup`."""
        return self._by_curve.get(curve)

    def get(self, curve: tuple, k: int, hi: int, stamp) -> tuple[float, int] | None:
        """The answer for (k, hi) under `stamp`, or the one up to the cap when its size is within
        hi (the range is a prefix: a best size within it, or none, is its answer too)."""
        return lookup(self._by_curve.get(curve), k, hi, curve[4], stamp)

    def put(self, curve: tuple, k: int, hi: int, stamp, answer: tuple[float, int]) -> None:
        if self.size > self.limit:
            self._by_curve.clear()
            self.size, self.generation = 0, self.generation + 1
        answers = self._by_curve.get(curve)
        if answers is None:
            answers = self._by_curve[curve] = {}
        if (k, hi) not in answers:
            self.size += 1
        answers[(k, hi)] = (stamp, answer)


def lookup(answers: dict | None, k: int, hi: int, cap: int, stamp) -> tuple[float, int] | None:
    if not answers:
        return None
    found = answers.get((k, hi))
    if found is not None and found[0] == stamp:
        return found[1]
    full = answers.get((k, cap))
    if full is not None and full[0] == stamp and full[1][1] <= hi:
        return full[1]
    return None
