"""Issue 22 item 3 as pure objects: no failover without a fault on a loaded host, and a kill -9
still detected within 5 s.

The failure detector (coord/detector.py) on a virtual clock, fed a seeded trace of heartbeats from
a loaded host: beats late by scheduler delays with a heavy tail (the old 1.5 s timeout fails such a
node over; the 4 s default does not), and a coordinator that is itself checked late. Then the
heartbeat thread (node/beat.py) with a fake coordinator client: it beats while its event loop is
blocked, and withholds beats from a loop that is wedged for good."""
from __future__ import annotations

import asyncio
import random
import threading
import time

import pytest

from mlsyskit.core.clock import VirtualClock
from mlsyskit.tools.kv.coord.detector import DetectorConfig, FailureDetector
from mlsyskit.tools.kv.node.beat import HeartbeatThread

CHECK_S = 0.25  # the coordinator checks every interval / 2 (coord/server.py)


def loaded_trace(seed: int, seconds: float, interval: float = 0.5) -> list[float]:
    """Beat arrival times of one node on a loaded 2-core host: each beat leaves `interval` after the
    previous one left, and arrives late by a scheduling delay: mostly milliseconds, 2% of beats
    stalled 1-3 s (a long loop turn, a starved process), the worst seen on the issue's busy host."""
    rng, out, t = random.Random(seed), [], 0.0
    while t < seconds:
        t += interval + rng.expovariate(1 / 0.02)
        delay = rng.uniform(1.0, 3.0) if rng.random() < 0.02 else rng.expovariate(1 / 0.05)
        out.append(t + delay)
        t += delay  # the next beat leaves only after this one got through (one thread, one socket)
    return out


def run_detector(config: DetectorConfig, beats: list[float], until: float, seed: int) -> dict[str, float]:
    """Feed `beats` of node n and check every CHECK_S (late by up to 0.3 s: the coordinator is busy
    too); returns {node: time it was failed}."""
    rng, clock, det = random.Random(seed), VirtualClock(), FailureDetector(config)
    det.watch("n", 0.0)
    failed: dict[str, float] = {}
    i = 0
    while clock.now() < until:
        clock.advance(CHECK_S + rng.uniform(0.0, 0.3))
        while i < len(beats) and beats[i] <= clock.now():
            det.beat("n", beats[i])
            i += 1
        for n in det.expire(clock.now()):
            failed.setdefault(n, clock.now())
    return failed


@pytest.mark.parametrize("seed", range(5))
def test_a_jittery_node_on_a_loaded_host_is_never_failed_at_the_default_timeout(seed: int) -> None:
    beats = loaded_trace(seed, 3600.0)
    assert max(b - a for a, b in zip(beats, beats[1:], strict=False)) > 1.5  # the trace has real stalls
    assert run_detector(DetectorConfig(), beats, 3600.0, seed) == {}
    # the same trace under the old 1.5 s timeout (0.5 s x 3, no floor) fails a healthy node over
    assert run_detector(DetectorConfig(min_timeout_s=0.0), beats, 3600.0, seed) != {}


@pytest.mark.parametrize("seed", range(20))
def test_a_killed_node_is_failed_within_5s_of_its_death(seed: int) -> None:
    rng = random.Random(seed)
    beats = loaded_trace(seed, 60.0)
    killed = beats[-1] + rng.uniform(0.0, 0.5)  # kill -9 some time after the last beat got out
    failed = run_detector(DetectorConfig(), beats, killed + 10.0, seed)
    assert set(failed) == {"n"} and 0 < failed["n"] - killed <= 5.0, failed["n"] - killed


class FakeCoordinator:
    """CoordClient's heartbeat, counted (a thread calls it)."""

    def __init__(self) -> None:
        self.beats: list[float] = []
        self.last_epoch = 1
        self.closed = False

    def heartbeat(self, node: str, applied: int | None = None) -> bool:
        self.beats.append(time.monotonic())
        return True

    def close(self) -> None:
        self.closed = True


def test_the_heartbeat_thread_beats_while_its_loop_is_blocked_and_answers_on_the_loop() -> None:
    client, answers = FakeCoordinator(), []

    async def main() -> HeartbeatThread:
        loop = asyncio.get_running_loop()
        beater = HeartbeatThread(client, "n", 0.05, lambda: 7, lambda *a: answers.append(
            (threading.current_thread() is threading.main_thread(), *a)), loop)
        beater.start()
        await asyncio.sleep(0.2)
        before = len(client.beats)
        time.sleep(1.0)  # one long turn of the loop
        assert len(client.beats) - before >= 10  # ~20 at 0.05 s
        await asyncio.sleep(0.1)
        beater.stop()
        beater.thread.join(5)
        return beater
    beater = asyncio.run(main())
    assert answers and all(on_loop and known and epoch == 1 for on_loop, _, known, epoch in answers)
    assert beater.withheld == 0 and client.closed


def test_a_wedged_loop_gets_no_more_beats() -> None:
    client = FakeCoordinator()

    async def main() -> HeartbeatThread:
        beater = HeartbeatThread(client, "n", 0.02, lambda: None, lambda *a: None, asyncio.get_running_loop(),
                                 max_loop_stall_s=0.3)
        beater.start()
        await asyncio.sleep(0.1)
        time.sleep(1.0)  # wedged past max_loop_stall_s: the thread stops beating for it
        withheld = beater.withheld
        last = client.beats[-1]
        await asyncio.sleep(0.2)  # the loop turns again: beats resume
        beater.stop()
        beater.thread.join(5)
        assert withheld >= 10 and client.beats[-1] > last
        return beater
    asyncio.run(main())
