"""Sub-step progress: the work notes where it is, a heartbeat reports it at least every interval.

The work (profiling, populating the tiers, a training step's modules, the optimizer sweep, a checkpoint)
calls `ProgressNote.set(template, *args)` at fine grain: storing a template and its arguments is cheap,
the text is formatted only when read. A `Heartbeat` thread wakes every `tick_s` and hands the current note
to a sink (the CLI's `Reporter.update(note=...)`, which prints a line once its own interval has passed),
so a log line appears every <= interval even while one module or one tensor takes longer than that.
`Heartbeat.poll()` is the heartbeat's whole body: tests drive it with a fake clock, without the thread.
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


class ProgressNote:
    """The latest note (template + args), written by any thread, read by the heartbeat."""

    def __init__(self) -> None:
        self._note: tuple[str, tuple[Any, ...]] = ("", ())

    def set(self, template: str, *args: Any) -> None:
        self._note = (template, args)  # one tuple assignment: atomic for the reader

    @property
    def text(self) -> str:
        template, args = self._note
        return template.format(*args) if args else template


class Heartbeat:
    """`with Heartbeat(note, sink):` calls `sink(note.text)` every `tick_s` on a daemon thread (and once at
    exit); `lock` serialises it with the caller's own use of the sink."""

    def __init__(self, note: ProgressNote, sink: Callable[[str], None], *, tick_s: float = 0.5,
                 lock: threading.Lock | None = None) -> None:
        self.note, self.sink, self.tick_s = note, sink, tick_s
        self.lock = lock or threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def poll(self) -> None:
        with self.lock:
            self.sink(self.note.text)

    def _run(self) -> None:
        while not self._stop.wait(self.tick_s):
            self.poll()

    def __enter__(self) -> Heartbeat:
        self._thread = threading.Thread(target=self._run, name="tencache-heartbeat", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
