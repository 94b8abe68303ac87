"""Whoever gets there first does the work (stealing.py, grad_pipeline.OptimizerWorker): a helper thread that
never gets a core must not stall the thread waiting for its work. Helpers are held at a gate (an Event)
instead of being descheduled by a busy host, so every schedule here is deterministic."""
from __future__ import annotations

import threading
from dataclasses import replace

import pytest
import torch

from mlsyskit.tools.offload.grad_pipeline import OptimizerWorker
from mlsyskit.tools.offload.stealing import StealingPool, Task
from mlsyskit.tools.offload.trainer import train, train_plain


def _recorder():
    ran: list[tuple[str, int]] = []

    def job(name: str) -> str:
        ran.append((name, threading.get_ident()))
        return name

    return ran, job


def test_a_task_no_helper_has_started_runs_in_the_waiting_thread_once():
    pool = StealingPool(1, "test-steal")
    gate, entered = threading.Event(), threading.Event()
    ran, job = _recorder()

    def occupy() -> None:  # the only helper is busy elsewhere until the gate opens
        entered.set()
        gate.wait()

    first = pool.submit(occupy)
    entered.wait()
    task = pool.submit(job, "b")
    assert not task.done()
    assert task.result() == "b" and ran == [("b", threading.get_ident())]  # ran here, without the helper
    gate.set()
    first.result()
    pool.shutdown(wait=True)
    assert ran == [("b", threading.get_ident())]  # the helper found it claimed and did not run it again


def test_an_ordered_task_runs_every_earlier_one_first_in_the_waiting_thread():
    ran, job = _recorder()
    first = Task(lambda: job("a"))
    second = Task(lambda: job("b"), first)
    third = Task(lambda: job("c"), second)
    assert third.result() == "c"   # no helper has started any: the waiter runs a, b, then c
    assert [name for name, _ in ran] == ["a", "b", "c"] and first.done() and second.done()
    assert not first.claim() and not second.claim()   # each ran once; a helper finding them skips them
    unordered = [Task(lambda: job("x")), Task(lambda: job("y"))]
    assert unordered[1].result() == "y" and not unordered[0].done()   # unordered: only what is waited for


def test_an_ordered_pool_runs_tasks_one_after_another_in_submission_order_whoever_runs_them():
    for _ in range(20):   # the helper and the waiter race for the tasks; the order must not depend on who wins
        pool = StealingPool(1, "test-ordered", ordered=True)
        events: list[tuple[str, str]] = []

        def step(name: str, events=events) -> str:
            events.append(("start", name))
            events.append(("end", name))
            return name

        tasks = [pool.submit(step, name) for name in "abcdef"]
        assert tasks[-1].result() == "f"
        pool.shutdown(wait=True)
        assert events == [(e, n) for n in "abcdef" for e in ("start", "end")]   # in order, never overlapping
    with pytest.raises(ValueError, match="ordered one exactly one"):
        StealingPool(2, "test-ordered", ordered=True)


def test_a_task_a_helper_started_is_waited_for_not_run_twice_and_its_error_reaches_the_waiter():
    pool = StealingPool(1, "test-steal")
    gate, entered = threading.Event(), threading.Event()
    calls = []

    def failing() -> None:
        calls.append(threading.get_ident())
        entered.set()
        gate.wait()
        raise OSError("disk gone")

    task = pool.submit(failing)
    entered.wait()  # the helper has claimed it
    waiter = threading.Thread(target=lambda: calls.append(pytest.raises(OSError, task.result).value))
    waiter.start()
    gate.set()
    waiter.join()
    pool.shutdown(wait=True)
    assert len(calls) == 2 and calls[0] != threading.get_ident() and str(calls[1]) == "disk gone"
    with pytest.raises(OSError, match="disk gone"):  # and to every later waiter
        task.result()


def test_shutdown_runs_every_task_already_submitted():
    pool = StealingPool(2, "test-steal")
    ran, job = _recorder()
    tasks = [pool.submit(job, str(i)) for i in range(20)]
    pool.shutdown(wait=True)
    assert all(t.done() for t in tasks) and sorted(n for n, _ in ran) == sorted(str(i) for i in range(20))
    with pytest.raises(RuntimeError):
        pool.submit(job, "late")


def test_optimizer_jobs_run_in_order_in_the_submitting_thread_when_the_worker_never_starts(monkeypatch):
    gate = threading.Event()
    real = torch.set_num_threads

    def held(n: int) -> None:  # the worker's first call: it stays here, as if it never got a core
        if threading.current_thread().name == "tencache-optimizer":
            gate.wait()
        real(n)

    monkeypatch.setattr(torch, "set_num_threads", held)
    worker = OptimizerWorker(2)
    ran, job = _recorder()
    for i in range(6):
        worker.submit(lambda i=i: job(str(i)))  # a full queue: the submitter runs the oldest job itself
    assert [n for n, _ in ran] == ["0", "1", "2", "3"]
    assert worker.join() is None
    assert ran == [(str(i), threading.get_ident()) for i in range(6)]  # in order, all here
    worker.submit(lambda: 1 / 0)
    worker.submit(lambda: job("skipped"))
    assert isinstance(worker.join(), ZeroDivisionError) and ran[-1][0] == "5"  # jobs after an error are skipped
    gate.set()
    worker.close()
    assert len(ran) == 6


@pytest.fixture
def helpers_never_scheduled(monkeypatch):
    """Every helper thread (copy, file tier, optimizer-state swaps, optimizer worker) waits at a gate that
    opens only when the engine shuts its helpers down."""
    gate = threading.Event()

    def held(run):
        def wrapper(self, *args):
            gate.wait()
            return run(self, *args)
        return wrapper

    def opening(stop):
        def wrapper(self, *args, **kwargs):
            gate.set()
            return stop(self, *args, **kwargs)
        return wrapper

    monkeypatch.setattr(StealingPool, "_work", held(StealingPool._work))
    monkeypatch.setattr(StealingPool, "shutdown", opening(StealingPool.shutdown))
    monkeypatch.setattr(OptimizerWorker, "_run", held(OptimizerWorker._run))
    monkeypatch.setattr(OptimizerWorker, "close", opening(OptimizerWorker.close))
    return gate


def test_training_with_helpers_that_never_run_finishes_with_the_plain_runs_losses(small_cfg, small_profile,
                                                                                   helpers_never_scheduled):
    cfg = replace(small_cfg, steps=3)
    reference = train_plain(cfg)  # before the engine: no helper of its own
    result = train(cfg, small_profile)  # parameters on all three tiers, optimizer states spilling to NVMe
    assert helpers_never_scheduled.is_set()  # opened only at shutdown: the training thread did every copy,
    assert result.losses == reference  # read, write and AdamW step itself, bit for bit
    moved = result.summary["bytes_moved_per_step"]
    assert any(k.startswith("nvme->") for k in moved) and "cpu->device" in moved
    assert result.summary["occupancy"]["optimizer_nvme_tensors"] > 0
