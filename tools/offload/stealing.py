"""Work that whoever gets there first does: a helper thread, or the thread that needs the result.

On a busy host a woken helper thread can wait tens of milliseconds for a core (load 15-20 on 2 cores), and
the training thread used to wait with it for every copy, NVMe read and optimizer-state swap it needed. Here
a task queued for a helper that no helper has started yet when its result is needed is run by the waiting
thread itself (the claim is atomic: each task runs exactly once, by one thread); a task a helper has
already started is waited for. So a descheduled helper delays only the task it is in the middle of.

`Task` is future-like (`done`, `result`); `StealingPool` runs tasks in submission order on its helpers.
Tasks may wait on tasks submitted before them (a read after the write of its block): such a wait runs the
earlier task or waits for the helper running it, so it cannot deadlock. An `ordered` pool (one helper) also
keeps a copy stream's guarantee that tasks run one after another in submission order: a waiter first runs
(or waits for) every earlier task, and the helper starts a task only once the one before it finished.
"""
from __future__ import annotations

import atexit
import functools
import queue
import threading
import weakref
from collections.abc import Callable
from typing import Any


class Task:
    """One call, run once by whichever thread claims it first: a pool's helper, or `result`'s caller."""

    __slots__ = ("_call", "_claim", "_finished", "_value", "_error", "_prev")

    def __init__(self, call: Callable[[], Any], prev: Task | None = None) -> None:
        self._call: Callable[[], Any] | None = call
        self._prev = prev  # an ordered pool's task before this one (None once it finished, or unordered)
        self._claim = threading.Lock()  # acquired once, never released: the claim to run the call
        self._finished = threading.Event()
        self._value: Any = None
        self._error: BaseException | None = None

    def claim(self) -> bool:
        """True for exactly one caller, which must then `run` the task."""
        return self._claim.acquire(blocking=False)

    def run(self) -> None:
        """Run the claimed call (after every earlier task of an ordered pool has finished)."""
        self._after_earlier()
        try:
            self._value = self._call()
        except BaseException as exc:  # re-raised by `result` (a storage error belongs to whoever waits)
            self._error = exc
        finally:
            self._call = None  # the call's buffers are not kept alive by a finished task
            self._finished.set()

    def _after_earlier(self) -> None:
        """Ordered pools: run or wait for the unfinished tasks before this one, oldest first."""
        earlier, t = [], self._prev
        while t is not None and not t.done():
            earlier.append(t)
            t = t._prev
        for t in reversed(earlier):
            if t.claim():
                t.run()
            else:
                t._finished.wait()
        self._prev = None  # nothing earlier is kept alive

    def done(self) -> bool:
        return self._finished.is_set()

    def result(self, timeout: float | None = None) -> Any:
        """The call's value, re-raising its error; runs the call here when no helper has started it."""
        if self.claim():
            self.run()
        elif not self._finished.wait(timeout):
            raise TimeoutError(f"task still running after {timeout} s")
        if self._error is not None:
            raise self._error
        return self._value


_LIVE: weakref.WeakSet = weakref.WeakSet()
_UNORDERED: Any = object()  # StealingPool._last of a pool whose tasks may run in any order


@atexit.register
def _drain_at_exit() -> None:
    """Helpers are daemon threads (an idle one must not keep the process alive): at exit, every task
    already submitted still runs (a queued NVMe write is not dropped), as ThreadPoolExecutor guarantees."""
    for pool in list(_LIVE):
        pool.shutdown(wait=True)


class StealingPool:
    """`workers` helper threads taking tasks in submission order; a task's waiter may run it first."""

    def __init__(self, workers: int, name: str, *, ordered: bool = False) -> None:
        if workers < 1 or (ordered and workers != 1):
            raise ValueError(f"a pool needs at least one worker (an ordered one exactly one), got {workers}")
        self._last: Task | None = None if ordered else _UNORDERED
        self._tasks: queue.SimpleQueue[Task | None] = queue.SimpleQueue()
        self._closed = False
        self._threads = [threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True) for i in range(workers)]
        for t in self._threads:
            t.start()
        _LIVE.add(self)

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Task:
        if self._closed:
            raise RuntimeError("submit after shutdown")
        call = functools.partial(fn, *args, **kwargs) if args or kwargs else fn
        if self._last is _UNORDERED:
            task = Task(call)
        else:
            task = self._last = Task(call, self._last)
        self._tasks.put(task)
        return task

    def _work(self) -> None:
        while (task := self._tasks.get()) is not None:
            if task.claim():  # else its waiter got there first and ran it
                task.run()

    def shutdown(self, wait: bool = True) -> None:
        """Stop after every task submitted so far has run (waiting for that with `wait`)."""
        if not self._closed:
            self._closed = True
            for _ in self._threads:
                self._tasks.put(None)
        if wait:
            for t in self._threads:
                if t is not threading.current_thread():
                    t.join()
