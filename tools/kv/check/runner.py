"""One seeded `bespokv check` run: start a cluster, load it while the nemesis strikes, heal,
quiesce, read everything back, verify, and leave the history and the verdict on disk.

Strong modes (ms-sc, aa-sc) must be linearizable per key (final reads included, so every
acknowledged write must be readable); eventual modes (ms-ec, aa-ec) must converge (every
replica of a shard equal) within `converge_s` of quiescence. Every mode must lose no
acknowledged write and read no phantom value.
"""
from __future__ import annotations

import asyncio
import json
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import hiredis

from mlsyskit.core.clock import Clock, RealClock
from mlsyskit.core.config import require
from mlsyskit.tools.kv.check.linearizability import check_history, operations
from mlsyskit.tools.kv.check.nemesis import FAULTS, Nemesis
from mlsyskit.tools.kv.check.procs import ProcCluster
from mlsyskit.tools.kv.check.verify import converge, lost_writes
from mlsyskit.tools.kv.check.workload import Workload, is_write_once
from mlsyskit.tools.kv.client.history import History
from mlsyskit.tools.kv.client.pipeline import RespConnection
from mlsyskit.tools.kv.controlets import controlet_class

MODES = ("ms-sc", "ms-ec", "aa-sc", "aa-ec")
FINAL_PROCESS = 1_000_000_000  # process ids of the final reads, far from the clients'
HISTORY_FILE = "history.jsonl"
ASYNC_WINDOW_S = 1.0  # eventual modes: how long before a node's failure its acked write may be unpropagated
RESULT_FILE = "result.json"


@dataclass(frozen=True)
class CheckSpec:
    mode: str = "ms-sc"
    nemesis: tuple[str, ...] = ("kill", "pause", "partition", "restart")  # coordinator-kill: on request
    ops: int = 2000
    clients: int = 10
    keys: int = 10
    seed: int = 0
    shards: int = 1
    replicas: int = 3
    datalet: str = "memory"
    timeout: float = 2.5  # per client operation, s
    converge_s: float = 5.0
    hold: tuple[float, float] = (0.6, 1.8)  # how long a fault lasts, s
    gap: tuple[float, float] = (0.3, 1.0)  # quiet time between faults, s
    coordinator: str = "none"  # none | embedded | zookeeper://HOST:PORT/ROOT: failover and rejoin
    heartbeat: float = 0.5  # with a coordinator: heartbeat interval, s (failed after `misses`)
    misses: int = 3

    def __post_init__(self) -> None:
        require(self.mode in MODES, f"--mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        require(all(f in FAULTS for f in self.nemesis), f"--nemesis takes {', '.join(FAULTS)} (or none)")
        require(self.ops >= 1 and self.keys >= 1, "--ops and --keys must be at least 1")
        require(1 <= self.clients <= 256, "--clients must be 1..256")
        require(1 <= self.shards <= 16 and 1 <= self.replicas <= 9, "--shards must be 1..16, --replicas 1..9")
        require(self.datalet in ("memory", "lmdb"), "--datalet must be memory or lmdb")
        require(self.timeout > 0 and self.converge_s > 0, "--timeout and converge_s must be positive")
        require(0 < self.hold[0] <= self.hold[1] and 0 <= self.gap[0] <= self.gap[1],
                "hold and gap are (min, max) seconds with min <= max")
        require(self.coordinator in ("none", "embedded") or self.coordinator.startswith("zookeeper://"),
                f"--coordinator must be none, embedded or zookeeper://HOST:PORT/ROOT, got {self.coordinator!r}")
        require(self.heartbeat > 0 and self.misses >= 1, "--heartbeat must be positive, misses at least 1")
        require("coordinator-kill" not in self.nemesis or self.coordinator != "none",
                "the coordinator-kill nemesis needs --coordinator")

    @property
    def strong(self) -> bool:
        return self.mode.endswith("-sc")


@dataclass
class CheckResult:
    spec: dict[str, Any]
    outcomes: dict[str, int] = field(default_factory=dict)
    faults: list[dict] = field(default_factory=list)
    linearizable: bool | None = None  # None: not checked (eventual mode) or budget ran out
    violations: list[str] = field(default_factory=list)
    lost_acked_writes: int = 0
    lww_inversions: int = 0  # eventual modes: acked register writes outlived by an older write (reported)
    # eventual modes: acked writes lost because the node that held them died (or, with failover, was
    # paused) before it had propagated them (acked within ASYNC_WINDOW_S before the fault started, by
    # the victim itself; see async_loss_windows): asynchronous replication's documented loss, counted
    # apart, not a failure
    async_failover_losses: int = 0
    reconfigurations: int = 0  # shard maps the coordinator committed (failovers and rejoins)
    phantoms: int = 0
    lost: list[str] = field(default_factory=list)
    converged: bool | None = False  # None: not observable (a history re-checked offline)
    convergence_s: float = 0.0
    digests: dict[str, Any] = field(default_factory=dict)
    max_write_wait_s: float = 0.0  # longest a write waited for an answer (ok or error), client timeouts aside
    write_timeouts: int = 0  # writes that got no answer within the client's timeout
    longest_write_outage_s: float = 0.0  # longest time in which no write succeeded
    error: str | None = None  # the run could not finish (a node would not restart ...)
    duration_s: float = 0.0
    history: str = ""

    @property
    def valid(self) -> bool:
        strong_ok = self.linearizable is True if self.spec["mode"].endswith("-sc") else True
        return (self.error is None and strong_ok and self.converged is not False and self.lost_acked_writes == 0
                and self.phantoms == 0)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "valid": self.valid}


async def run_check(spec: CheckSpec, out_dir: Path, log: Callable[[str], None] = lambda _: None,
                    progress: Callable[[int], None] = lambda _: None, clock: Clock | None = None) -> CheckResult:
    clock = clock or RealClock()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    result = CheckResult(spec={**asdict(spec), "nemesis": list(spec.nemesis)})
    history = History(clock)
    cluster = ProcCluster(spec.mode, spec.datalet, spec.shards, spec.replicas, out_dir / "cluster",
                          partitionable="partition" in spec.nemesis, clock=clock,
                          coordinator=None if spec.coordinator == "none" else spec.coordinator,
                          heartbeat=spec.heartbeat, misses=spec.misses)
    started = clock.now()
    try:
        log(f"starting a {spec.shards}x{spec.replicas} {spec.mode} cluster ({spec.datalet} datalet)")
        await cluster.start()
        workload = Workload(cluster.map, history, clock, ops=spec.ops, clients=spec.clients, keys=spec.keys,
                            seed=spec.seed, timeout=spec.timeout, on_progress=progress,
                            fetch_map=cluster.current_map if spec.coordinator != "none" else None)
        nemesis = Nemesis(cluster, spec.nemesis, spec.seed, clock, log, hold=spec.hold, gap=spec.gap)
        load_done = asyncio.Event()
        nemesis_task = asyncio.get_running_loop().create_task(nemesis.run(load_done.is_set))
        try:
            await workload.run(keep_going=lambda: not (nemesis.covered or nemesis_task.done()))
        except BaseException:
            nemesis_task.cancel()  # the cluster is about to be stopped: no fault may touch it after
            raise
        finally:
            load_done.set()
        await nemesis_task  # finishes the fault in progress; a failure here (no restart) ends the run
        result.faults = nemesis.journal
        result.outcomes = dict(workload.outcomes)
        log("healing every fault, then waiting for the replicas to converge")
        await cluster.heal()
        result.converged, result.convergence_s, result.digests = await converge(cluster, clock, spec.converge_s)
        log("reading every key back")
        await final_reads(cluster, history, workload.register_keys() + workload.once_keys,
                          every_replica=not spec.strong, timeout=spec.timeout)
        result.reconfigurations = cluster.map.epoch - 1
        verify(spec.strong, history, result, async_loss_windows(spec, nemesis.journal))
    except Exception as e:  # noqa: BLE001 - any failure of the run is its verdict (error, exit 1)
        result.error = f"{type(e).__name__}: {e}"
        if not isinstance(e, (RuntimeError, OSError)):  # unexpected: keep the traceback for whoever debugs it
            log(traceback.format_exc().rstrip())
    finally:
        await cluster.stop()
        result.duration_s = round(clock.now() - started, 3)
        path = out_dir / HISTORY_FILE
        history.write_jsonl(path)
        result.history = str(path)
        (out_dir / RESULT_FILE).write_text(json.dumps(result.as_dict(), indent=2))
    return result


def async_loss_windows(spec: CheckSpec, journal: list[dict]) -> list[tuple[float, float, str | None]]:
    """(from, to, node) spans in which an eventual mode may lose the writes it acknowledged:
    the ASYNC_WINDOW_S before a fault that discards what a node had not yet propagated. Both
    eventual controlets answer a write before they send it on.

    A killed node restarts empty and copies a survivor, so what it alone had acked is gone: only
    writes acked BY the victim (an ms-ec master's, an aa-ec replica's own). With failover a paused
    node is replaced likewise; and an ms-ec master's last writes are lost whichever node relayed
    them to it (a client on an older map), so there any write in the window counts (node None)."""
    if spec.mode not in ("ms-ec", "aa-ec"):
        return []
    failover = spec.coordinator != "none"
    kinds = ("kill", "pause") if failover else ("kill",)
    by_victim = not (spec.mode == "ms-ec" and failover)
    return [(f["at"] - ASYNC_WINDOW_S, f["at"], f["node"] if by_victim else None) for f in journal
            if f["phase"] == "start" and f["fault"] in kinds]


def verify(strong: bool, history: History, result: CheckResult,
           async_windows: list[tuple[float, float, str | None]] = ()) -> None:
    """Linearizability (strong modes), lost and phantom writes, write availability; into result.
    An acked write lost that was answered inside one of `async_windows` (clock times before a
    fault, and by its victim where the window names one) counts as an async loss instead."""
    ops = operations(history)
    if strong:
        report = check_history(history)
        result.linearizable = report.linearizable
        result.violations = [line for r in report.violations[:5] for line in r.explain()]
        result.violations += [f"key {r.key!r}: search budget exhausted (unknown)" for r in report.unknown[:5]]
    lost = lost_writes(ops, final_values(history))
    if not strong:
        # An eventual register resolves writes the replicas had not exchanged yet by its own
        # order (LWW), which may put an older write last: counted, not a failure. A write-once
        # key has a single writer, so its absence is a loss whatever the order.
        inverted = [op for op in lost.lost if not is_write_once(op.key)]
        lost.lost = [op for op in lost.lost if is_write_once(op.key)]
        result.lww_inversions = len(inverted)
        in_window = [op for op in lost.lost
                     if any(a <= op.ret <= b and node in (None, op.node) for a, b, node in async_windows)]
        lost.lost = [op for op in lost.lost if op not in in_window]
        result.async_failover_losses = len(in_window)
        result.lost = [f"LWW kept an older value over acknowledged {op.key!r} {op.describe()}" for op in inverted[:5]]
    result.lost_acked_writes, result.phantoms = len(lost.lost), len(lost.phantoms)
    result.lost = lost.explain() + result.lost
    timeout = result.spec.get("timeout", CheckSpec.timeout)
    result.max_write_wait_s, result.write_timeouts, result.longest_write_outage_s = write_availability(
        history, timeout)


def final_values(history: History) -> dict[str, list[str | None]]:
    """What the final reads (after heal and quiescence) returned, per key."""
    final: dict[str, list[str | None]] = {}
    for e in history.events:
        if e.process > FINAL_PROCESS and e.type == "ok":
            final.setdefault(e.key, []).append(e.value)
    return final


def recheck(path: Path, mode: str) -> CheckResult:
    """Verify a saved history again (no cluster): linearizability, lost and phantom writes."""
    result = CheckResult(spec={"mode": mode, "replayed": str(path)}, converged=None, history=str(path))
    history = History.read_jsonl(Path(path))
    result.outcomes = {k: v for k, v in history.counts().items() if k != "invoke"}
    verify(mode.endswith("-sc"), history, result)
    return result


def write_availability(history: History, timeout: float) -> tuple[float, int, float]:
    """(longest wait for an answered write, writes unanswered within `timeout`, longest span
    without a successful write), in seconds; the final reads are not counted."""
    started: dict[int, float] = {}
    waits, timeouts, ok_times = [0.0], 0, []
    for e in history.events:
        if e.process >= FINAL_PROCESS or e.f not in ("put", "del"):
            continue
        if e.type == "invoke":
            started[e.process] = e.time
        elif e.process in started:
            wait = e.time - started.pop(e.process)
            if e.type == "info" and wait >= timeout * 0.999:  # the client gave up: no answer came
                timeouts += 1
            else:
                waits.append(wait)
            if e.type == "ok":
                ok_times.append(e.time)
    gaps = [b - a for a, b in zip(ok_times, ok_times[1:], strict=False)]
    return round(max(waits), 4), timeouts, round(max(gaps, default=0.0), 4)


async def final_reads(cluster: ProcCluster, history: History, keys: list[bytes], every_replica: bool,
                      timeout: float) -> None:
    """Read every key at its shard's read targets (every replica for eventual modes), recorded."""
    smap = cluster.map
    cls = controlet_class(smap.controlet)
    process = FINAL_PROCESS
    for shard, reps in enumerate(smap.shards):
        targets = list(reps) if every_replica else list(cls.read_targets(reps))
        mine = [k for k in keys if smap.shard_for(k) == shard]
        for node in targets:
            addr = smap.nodes[node]
            try:
                conn = await RespConnection.connect(addr.host, addr.port, timeout=timeout)
            except (OSError, TimeoutError):
                continue  # no final reads from this replica; convergence already failed for it
            try:
                for key in mine:
                    process += 1
                    history.invoke(process, "get", key)
                    try:
                        value = await asyncio.wait_for(conn.call(b"GET", key), timeout)
                    except (OSError, TimeoutError, hiredis.ReplyError):
                        history.complete(process, "fail", "get", key)
                        break  # this replica does not answer: the rest would only time out too
                    history.complete(process, "ok", "get", key, value)
            finally:
                await conn.close()
