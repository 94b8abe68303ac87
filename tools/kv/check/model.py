"""The sequential specification a key's operations are checked against: one register.

State is the key's value, or None when the key is absent. An operation is a pure step
`step(state, op) -> (legal, next_state)`; results that the client never learnt (an `info`
write) are unknown and therefore legal in every state.
"""
from __future__ import annotations

from dataclasses import dataclass

UNKNOWN = object()  # the result of an operation whose outcome the client never learnt


@dataclass(frozen=True)
class Op:
    """One completed (or possibly-completed) operation on one key."""

    id: int
    process: int
    f: str  # get | put | del | exists
    key: str
    arg: str | None  # the value written by put
    result: object  # value read (get), "1"/"0" (del, exists), UNKNOWN for info
    call: float
    ret: float  # math.inf for info: it may take effect any time after its invoke
    definite: bool  # False for info
    node: str | None = None  # the node that answered it, where the history says

    def describe(self) -> str:
        ret = "?" if not self.definite else f"{self.ret:.6f}"
        res = "?" if self.result is UNKNOWN else self.result
        what = f"put {self.arg!r}" if self.f == "put" else f"{self.f} -> {res!r}"
        return f"p{self.process} {what} [{self.call:.6f}, {ret}]"


def step(state: str | None, op: Op) -> tuple[bool, str | None]:
    f, result = op.f, op.result
    if f == "put":
        return True, op.arg
    if f == "get":
        return result == state, state
    if f == "exists":
        return result == ("1" if state is not None else "0"), state
    if f == "del":
        legal = result is UNKNOWN or result is None or result == ("1" if state is not None else "0")
        return legal, None
    raise ValueError(f"unknown function {f!r}")
