"""Operation histories: every client operation as invoke / ok / fail / info events.

The format follows Jepsen's: an `invoke` when the client sends, then exactly one of `ok`
(it happened, with its result), `fail` (it certainly did not happen) or `info` (it may or
may not have happened: a write whose connection died, timed out or got an ambiguous error).
Results in `value`: the value read for `get`, the value written for `put`, "1"/"0" for
`del` (existed) and `exists`. The linearizability checker (tools/kv/check) consumes these;
times come from an injected clock so simulations record virtual time. Histories are saved
as JSON lines (one event per line) so any checked run can be replayed and re-checked.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from mlsyskit.core.clock import Clock, RealClock

KINDS = ("invoke", "ok", "fail", "info")
FUNCTIONS = ("get", "put", "del", "exists")


class HistoryFormatError(ValueError):
    """A history file that is not a list of well-formed events."""


@dataclass(frozen=True)
class Event:
    process: int
    type: str  # invoke | ok | fail | info
    f: str  # get | put | del | exists
    key: str
    value: str | None
    time: float
    node: str | None = None  # a completion's: the node that answered (which replica acked a write)

    @classmethod
    def from_dict(cls, d: dict) -> Event:
        try:
            event = cls(int(d["process"]), str(d["type"]), str(d["f"]), str(d["key"]),
                        None if d.get("value") is None else str(d["value"]), float(d["time"]),
                        None if d.get("node") is None else str(d["node"]))
        except (KeyError, TypeError, ValueError) as e:
            raise HistoryFormatError(f"not a history event: {d!r} ({e})") from None
        if event.type not in KINDS or event.f not in FUNCTIONS:
            raise HistoryFormatError(f"unknown event type or function in {d!r}")
        return event


class History:
    def __init__(self, clock: Clock | None = None) -> None:
        self.clock = clock or RealClock()
        self.events: list[Event] = []

    def invoke(self, process: int, f: str, key: bytes, value: bytes | None = None) -> None:
        self._add(process, "invoke", f, key, value)

    def complete(self, process: int, kind: str, f: str, key: bytes, value: bytes | str | None = None,
                 node: str | None = None) -> None:
        if kind not in ("ok", "fail", "info"):
            raise ValueError(f"completion must be ok, fail or info, not {kind!r}")
        self._add(process, kind, f, key, value, node)

    def _add(self, process: int, kind: str, f: str, key: bytes, value: bytes | str | None,
             node: str | None = None) -> None:
        text = value.decode(errors="backslashreplace") if isinstance(value, bytes) else value
        self.events.append(Event(process, kind, f, key.decode(errors="backslashreplace"),
                                 None if text is None else str(text), self.clock.now(), node))

    def pending(self) -> int:
        """Operations invoked but not completed (must be 0 when a run ends cleanly)."""
        open_ops: dict[int, int] = {}
        for e in self.events:
            open_ops[e.process] = open_ops.get(e.process, 0) + (1 if e.type == "invoke" else -1)
        return sum(open_ops.values())

    def counts(self) -> dict[str, int]:
        out = dict.fromkeys(KINDS, 0)
        for e in self.events:
            out[e.type] += 1
        return out

    def write_jsonl(self, path: Path) -> None:
        with open(path, "w") as fh:
            for e in self.events:
                record = asdict(e)
                if record["node"] is None:  # invokes, and histories of clients that do not know
                    del record["node"]
                fh.write(json.dumps(record) + "\n")

    @classmethod
    def read_jsonl(cls, path: Path) -> History:
        history = cls()
        with open(path) as fh:
            for n, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except ValueError as e:
                    raise HistoryFormatError(f"{path}:{n}: not JSON ({e})") from None
                if not isinstance(record, dict):
                    raise HistoryFormatError(f"{path}:{n}: not an event object")
                history.events.append(Event.from_dict(record))
        return history
