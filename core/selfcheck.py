"""`python -m mlsyskit.core.selfcheck`: a seeded M/M/1 queue on the event loop, reported through telemetry.

It exercises clock, sim and telemetry end to end and checks the simulated mean wait against
queueing theory (Wq = rho / (mu - lambda)), so the demo's core section verifies something real.
"""
from __future__ import annotations

import sys

from mlsyskit.core.console import emit_table
from mlsyskit.core.sim import EventLoop, Seeds
from mlsyskit.core.telemetry import Telemetry


def mm1_mean_wait(arrival_rate: float, service_rate: float, customers: int, seed: int) -> Telemetry:
    loop = EventLoop()
    tel = Telemetry(clock=loop.clock, run_id=f"mm1-seed{seed}")
    arrivals, services = Seeds(seed).random("arrivals"), Seeds(seed).random("services")
    queue: list[float] = []
    busy = False

    def start_service() -> None:
        nonlocal busy
        arrived = queue.pop(0)
        tel.observe("wait_s", loop.now() - arrived)
        busy = True
        loop.schedule(services.expovariate(service_rate), finish)

    def finish() -> None:
        nonlocal busy
        busy = False
        tel.count("served")
        if queue:
            start_service()

    def arrive(n: int) -> None:
        queue.append(loop.now())
        tel.count("arrived")
        if not busy:
            start_service()
        if n + 1 < customers:
            loop.schedule(arrivals.expovariate(arrival_rate), lambda: arrive(n + 1))

    loop.schedule(0.0, lambda: arrive(0))
    loop.run()
    return tel


def main() -> int:
    lam, mu = 0.8, 1.0
    tel = mm1_mean_wait(lam, mu, customers=200_000, seed=0)
    emit_table(tel.summary_table("core selfcheck: M/M/1 queue on the virtual clock"))
    expected = (lam / mu) / (mu - lam)
    measured = tel.histogram("wait_s").stats()["mean"]
    print(f"mean wait {measured:.3f} s, theory {expected:.3f} s")
    return 0 if abs(measured - expected) / expected < 0.1 else 1


if __name__ == "__main__":
    sys.exit(main())
