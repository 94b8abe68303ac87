import asyncio

import pytest

from mlsyskit.core.clock import RealClock, VirtualClock
from mlsyskit.core.selfcheck import mm1_mean_wait
from mlsyskit.core.sim import EventLoop, Seeds, sub_seed


def test_virtual_clock_moves_only_forward():
    c = VirtualClock(5.0)
    c.sleep(2.5)
    asyncio.run(c.asleep(0.5))
    assert c.now() == 8.0
    with pytest.raises(ValueError):
        c.set(1.0)
    with pytest.raises(ValueError):
        c.advance(-1)


def test_real_clock_is_monotonic():
    c = RealClock()
    a = c.now()
    c.sleep(0)
    assert c.now() >= a


def test_events_run_in_time_then_fifo_order():
    loop = EventLoop()
    seen = []
    loop.schedule(2.0, lambda: seen.append(("b", loop.now())))
    loop.schedule(1.0, lambda: seen.append(("a", loop.now())))
    loop.schedule(2.0, lambda: seen.append(("c", loop.now())))
    loop.schedule(1.0, lambda: loop.schedule(0.5, lambda: seen.append(("nested", loop.now()))))
    assert loop.run() == 5
    assert seen == [("a", 1.0), ("nested", 1.5), ("b", 2.0), ("c", 2.0)]


def test_cancel_and_run_until():
    loop = EventLoop()
    seen = []
    h = loop.schedule(1.0, lambda: seen.append(1))
    loop.schedule(3.0, lambda: seen.append(3))
    h.cancel()
    assert loop.pending() == 1
    loop.run(until=2.0)
    assert seen == [] and loop.now() == 2.0
    loop.run()
    assert seen == [3]
    with pytest.raises(ValueError):
        loop.schedule(-1, lambda: None)


def test_sub_seeds_are_stable_and_independent():
    assert sub_seed(0, "a") == sub_seed(0, "a")
    assert sub_seed(0, "a") != sub_seed(0, "b") != sub_seed(1, "a")
    s = Seeds(42)
    first = [s.random("x").random() for _ in range(2)]
    assert first[0] == first[1]
    assert s.numpy("y").integers(0, 1 << 30) == Seeds(42).numpy("y").integers(0, 1 << 30)


def test_simulation_is_deterministic_and_matches_theory():
    a = mm1_mean_wait(0.5, 1.0, customers=20_000, seed=3)
    b = mm1_mean_wait(0.5, 1.0, customers=20_000, seed=3)
    assert a.histogram("wait_s").values == b.histogram("wait_s").values
    mean = a.histogram("wait_s").stats()["mean"]
    assert mean == pytest.approx(1.0, rel=0.15)  # Wq = rho/(mu-lambda) = 1.0
    c = mm1_mean_wait(0.5, 1.0, customers=20_000, seed=4)
    assert c.histogram("wait_s").values != a.histogram("wait_s").values
