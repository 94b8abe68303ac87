"""Live switches under load, checked (`scripts/bench_kv_faults.py --switch`, tests/kv/test_switch.py).

A 1x3 cluster under the embedded coordinator starts in `modes[0]`; clients keep reading and
writing while it is switched to modes[1], modes[2], ... Each client records every operation in
one History. After each switch is acknowledged the clients move to fresh keys (segment s uses
keys `s<s>k<i>` and write-once keys `s<s>u<n>`), so each segment after a switch to a strong mode
is checked for linearizability from an empty initial state: exactly "linearizable from the
moment the switch was acknowledged". Across all segments: no acknowledged write may be lost
(final reads at the final mode's read targets), and every error a client saw must be a
retriable one (-TRYAGAIN). Throughput is counted in 0.25 s bins; the recovery time of a switch
is from its start to the first bin at >= 90% of the new mode's steady state (the median of the
segment's last second).
"""
from __future__ import annotations

import asyncio
import dataclasses
import random
from pathlib import Path
from typing import Any

from mlsyskit.core.clock import Clock, RealClock
from mlsyskit.core.telemetry import percentile
from mlsyskit.tools.kv.check.linearizability import check_history, operations
from mlsyskit.tools.kv.check.procs import ProcCluster
from mlsyskit.tools.kv.check.runner import final_reads, final_values
from mlsyskit.tools.kv.check.verify import lost_writes
from mlsyskit.tools.kv.client.history import History
from mlsyskit.tools.kv.client.mapfollow import FollowingClient
from mlsyskit.tools.kv.client.smart import KVError
from mlsyskit.tools.kv.ops.switch import switch

BIN_S = 0.25


class _Load:
    def __init__(self, cluster: ProcCluster, history: History, clock: Clock, clients: int, keys: int,
                 seed: int) -> None:
        self.cluster, self.history, self.clock = cluster, history, clock
        self.clients, self.keys, self.seed = clients, keys, seed
        self.segment = 0
        self.stop = asyncio.Event()
        self.done: list[float] = []  # completion times of successful operations
        self.errors: list[str] = []
        self.once: list[bytes] = []
        self.counter = 0

    async def client(self, c: int) -> None:
        rng = random.Random(self.seed * 7919 + c)
        client = FollowingClient(self.cluster.map, self.cluster.current_map, seed=rng.randrange(2**32),
                                 history=self.history, process=c, timeout=2.5)
        try:
            while not self.stop.is_set():
                seg = self.segment
                r = rng.random()
                self.counter += 1
                try:
                    if r < 0.15:
                        key = b"s%du%d" % (seg, len(self.once))
                        self.once.append(key)
                        await client.put(key, b"v%d" % self.counter)
                    elif r < 0.55:
                        await client.put(b"s%dk%d" % (seg, rng.randrange(self.keys)), b"v%d" % self.counter)
                    else:
                        await client.get(b"s%dk%d" % (seg, rng.randrange(self.keys)))
                    self.done.append(self.clock.now())
                except (KVError, OSError, TimeoutError) as e:
                    self.errors.append(f"{type(e).__name__}: {e}")
                    client.process += self.clients  # an info op may still be in flight
                    await self.clock.asleep(0.01)
        finally:
            await client.close()


def _bins(times: list[float], start: float, end: float) -> list[int]:
    n = max(1, int((end - start) / BIN_S))
    out = [0] * n
    for t in times:
        i = int((t - start) / BIN_S)
        if 0 <= i < n:
            out[i] += 1
    return out


async def run_switches(modes: list[str], out_dir: Path, seed: int = 0, clients: int = 4, keys: int = 4,
                       segment_s: float = 2.0, clock: Clock | None = None) -> dict[str, Any]:
    clock = clock or RealClock()
    cluster = ProcCluster(modes[0], "memory", 1, 3, Path(out_dir) / "cluster", partitionable=False, clock=clock,
                          coordinator="embedded")
    history = History(clock)
    switches: list[dict[str, Any]] = []
    await cluster.start()
    load = _Load(cluster, history, clock, clients, keys, seed)
    tasks = [asyncio.get_running_loop().create_task(load.client(c)) for c in range(clients)]
    try:
        await clock.asleep(segment_s)
        for target in modes[1:]:
            began = clock.now()
            result = await asyncio.to_thread(switch, cluster.coord_spec, target, clock)
            acked = clock.now()
            load.segment += 1  # fresh keys from the acknowledgement on
            switches.append({"to": target, "began": began, "acked": acked, "segment_s": segment_s,
                             **result.as_dict()})
            await clock.asleep(segment_s)
        end = clock.now()
        load.stop.set()
        await asyncio.gather(*tasks)
        cluster.map = await cluster.current_map()
        keys_all = sorted({e.key.encode() for e in history.events})
        await final_reads(cluster, history, keys_all, every_replica=False, timeout=2.5)
    finally:
        load.stop.set()  # a switch that failed must not leave the clients running
        for task in tasks:
            task.cancel()
        await asyncio.wait(tasks, timeout=10.0)
        await cluster.stop()
        history.write_jsonl(Path(out_dir) / "history.jsonl")  # so a failed verdict can be replayed and read
    return _verdict(modes, history, switches, load, end)


def _until(events: list, cutoff: float) -> list:
    """The history as the strong mode saw it: operations invoked after `cutoff` are dropped; a write still
    in flight at `cutoff` becomes `info` (it may or may not have taken effect), a read in flight is dropped
    (its answer may come from the next mode)."""
    out: list = []
    pending: dict[int, int] = {}  # process -> index of its open invoke in `out`
    for e in events:
        if e.type == "invoke":
            if e.time < cutoff:
                pending[e.process] = len(out)
                out.append(e)
            continue
        at = pending.pop(e.process, None)
        if at is None:
            continue  # its invoke came after the cutoff
        if e.time < cutoff:
            out.append(e)
        elif e.f == "get":
            out[at] = None  # an unfinished read constrains nothing
        else:
            out.append(dataclasses.replace(e, type="info"))
    return [e for e in out if e is not None]


def _verdict(modes: list[str], history: History, switches: list[dict], load: _Load, end: float) -> dict[str, Any]:
    linearizable: dict[str, bool | None] = {}
    for seg, sw in enumerate(switches, start=1):
        if not sw["to"].endswith("-sc"):
            continue
        prefix = f"s{seg}"
        # the claim holds until the next switch begins: past that the store may be moving to an eventual mode
        cutoff = switches[seg]["began"] if seg < len(switches) else float("inf")
        part = History(history.clock)
        part.events = _until(
            [e for e in history.events if e.key.startswith(prefix + "k") or e.key.startswith(prefix + "u")], cutoff)
        report = check_history(part)
        linearizable[f"{seg}:{sw['before']}->{sw['to']}"] = report.linearizable
    lost = lost_writes(operations(history), final_values(history))
    if not modes[-1].endswith("-sc"):  # an eventual register may keep an older value (LWW): not a loss
        lost.lost = [op for op in lost.lost if "u" in op.key]
    for sw in switches:
        bins = _bins(load.done, sw["began"], sw["acked"] + sw["segment_s"])
        steady = percentile(bins[-4:], 50) if len(bins) >= 4 else max(bins)
        back = next((i for i, b in enumerate(bins) if b >= 0.9 * steady), len(bins))
        sw["steady_ops_per_bin"] = steady
        sw["recovery_s"] = round(back * BIN_S, 3)
    # retriable: a -TRYAGAIN, or the client's own 2.5 s timeout (outcome unknown as with -TRYAGAIN; the
    # server's write timeout is 8 s, so during a switch the client may give up first)
    not_retriable = [e for e in load.errors if "TRYAGAIN" not in e and not e.startswith("TimeoutError")]
    return {"modes": modes, "switches": switches, "linearizable_after_switch": linearizable,
            "lost_acked_writes": len(lost.lost), "phantoms": len(lost.phantoms), "lost": lost.explain(),
            "errors": len(load.errors), "non_retriable_errors": len(not_retriable),
            "error_samples": sorted(set(not_retriable))[:5], "ops_ok": len(load.done),
            "valid": all(v is True for v in linearizable.values()) and not lost.lost and not lost.phantoms
            and not not_retriable}
