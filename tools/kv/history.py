"""Operation histories: every client operation as invoke / ok / fail / info events.

The format follows Jepsen's: an `invoke` when the client sends, then exactly one of `ok`
(it happened, with the value read), `fail` (it certainly did not happen) or `info` (it
may or may not have happened: a write whose connection died). A linearizability checker
consumes these; times come from an injected clock so simulations record virtual time.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from mlsyskit.core.clock import Clock, RealClock


@dataclass(frozen=True)
class Event:
    process: int
    type: str  # invoke | ok | fail | info
    f: str  # get | put | del | exists
    key: str
    value: str | None
    time: float


class History:
    def __init__(self, clock: Clock | None = None) -> None:
        self.clock = clock or RealClock()
        self.events: list[Event] = []

    def invoke(self, process: int, f: str, key: bytes, value: bytes | None = None) -> None:
        self._add(process, "invoke", f, key, value)

    def complete(self, process: int, kind: str, f: str, key: bytes, value: bytes | None = None) -> None:
        if kind not in ("ok", "fail", "info"):
            raise ValueError(f"completion must be ok, fail or info, not {kind!r}")
        self._add(process, kind, f, key, value)

    def _add(self, process: int, kind: str, f: str, key: bytes, value: bytes | None) -> None:
        text = value.decode(errors="backslashreplace") if isinstance(value, bytes) else value
        self.events.append(Event(process, kind, f, key.decode(errors="backslashreplace"),
                                 None if text is None else str(text), self.clock.now()))

    def pending(self) -> int:
        """Operations invoked but not completed (must be 0 when a run ends cleanly)."""
        open_ops: dict[int, int] = {}
        for e in self.events:
            open_ops[e.process] = open_ops.get(e.process, 0) + (1 if e.type == "invoke" else -1)
        return sum(open_ops.values())

    def write_jsonl(self, path: Path) -> None:
        with open(path, "w") as fh:
            for e in self.events:
                fh.write(json.dumps(asdict(e)) + "\n")
