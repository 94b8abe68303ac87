"""bespokv command line: cluster lifecycle, client commands, YCSB bench, the consistency checker.

The client commands (get/put/del/shardmap/bench) live in cli_client.py. Exit codes: 0 success, 1 runtime failure (unreachable, a failed check, an
error from the cluster), 2 usage error.
"""
from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import typer

from mlsyskit.core.cli import (
    config_option,
    ensure_out_dir,
    json_option,
    load_command_config,
    make_app,
    out_option,
    quiet_option,
    run_app,
    seed_option,
    verbose_option,
)
from mlsyskit.core.console import emit_json, emit_table, log, make_table, reporter, set_verbosity
from mlsyskit.core.errors import RuntimeFailure, UsageError
from mlsyskit.tools.kv.cli_client import DATA_DIR, bench, delete, get, put, resolve_data_dir, shardmap
from mlsyskit.tools.kv.controlets import controlet_name
from mlsyskit.tools.kv.ops import processes

app = make_app(
    "bespokv",
    "Scale-out KV store framework (after bespoKV, SC'18): turns a single-server KV store (a datalet) into "
    "a sharded, replicated store by picking controlets for topology (master-slave / active-active) and "
    "consistency (strong / eventual), spoken to over the Redis protocol.",
)

@app.command()
def up(shards: int = typer.Option(None, "--shards", help="Number of shards S (default 1)."),
       replicas: int = typer.Option(None, "--replicas", help="Replicas per shard R (default 1)."),
       topology: str = typer.Option(None, "--topology", help="ms (master-slave, default) or aa (active-active)."),
       consistency: str = typer.Option(None, "--consistency", help="strong (default) or eventual."),
       datalet: str = typer.Option(None, "--datalet", help="memory (default), lmdb or redis."),
       base_port: int = typer.Option(None, "--base-port",
                                     help="Proxy on P, nodes on P+1..., redis datalets after (default 7000)."),
       data_dir: Path = DATA_DIR,
       coordinator: str = typer.Option(None, "--coordinator",
                                       help="embedded (default: a coordinator process keeping the map in SQLite), "
                                            "zookeeper://HOST:PORT[,...]/ROOT, or none (no failover)."),
       heartbeat: float = typer.Option(None, "--heartbeat",
                                       help="Seconds between node heartbeats (0.5); a node is failed over after 3 missed and at least 8 intervals (4 s), so a busy host is not mistaken for a dead one."),
       hosts: Path = typer.Option(None, "--hosts", help="TOML file of [[host]] name, address, exec: places the "
                                                       "nodes on several hosts (replicas of a shard apart)."),
       host: str = typer.Option(None, "--host", help="Address of the proxy and coordinator (127.0.0.1); "
                                                     "with --hosts, one every host reaches."),
       foreground: bool = typer.Option(False, "--foreground", help="Stay attached; Ctrl-C stops the cluster."),
       supervise: bool = typer.Option(None, "--supervise/--no-supervise",
                                      help="With a coordinator (default on): a supervisor process restarts a "
                                           "node whose process died, once it was failed over, empty (it copies "
                                           "the state from a survivor)."),
       max_restarts: int = typer.Option(None, "--max-restarts",
                                        help="Supervisor's crash-loop limit: restarts of one process per "
                                             "--restart-window (5), then it gives up on it."),
       restart_window: float = typer.Option(None, "--restart-window", help="Seconds (60)."),
       requirepass: str = typer.Option(None, "--requirepass",
                                       help="Clients must AUTH with this password (proxy and nodes; off by "
                                            "default). Kept in <data-dir>/requirepass, mode 0600, never on a "
                                            "node's command line; prefer the config key or "
                                            "$MLSYSKIT_BESPOKV_UP_REQUIREPASS to keep it out of `ps`."),
       config: Path = config_option(), as_json: bool = json_option(),
       verbose: bool = verbose_option(), quiet: bool = quiet_option()) -> None:
    """Start a cluster on loopback, wait until every process answers, print endpoints and status.

    Config file keys: shards, replicas, controlet (ms-sc, ms-ec, aa-sc, aa-ec), datalet, host,
    base_port, data_dir, coordinator, heartbeat, misses, hosts, requirepass, supervise,
    max_restarts, restart_window."""
    set_verbosity(verbose, quiet)
    controlet = None
    if topology is not None or consistency is not None:
        controlet = controlet_name(topology or "ms", consistency or "strong")
    spec = load_command_config(processes.ClusterSpec, config, {
        "shards": shards, "replicas": replicas, "controlet": controlet, "datalet": datalet,
        "base_port": base_port, "data_dir": data_dir, "coordinator": coordinator, "heartbeat": heartbeat,
        "hosts": hosts, "host": host, "requirepass": requirepass, "supervise": supervise,
        "max_restarts": max_restarts, "restart_window": restart_window})
    log(f"starting {spec.shards}x{spec.replicas} {spec.controlet} cluster on the {spec.datalet} datalet ...")
    record = processes.up(spec)
    if as_json:
        emit_json(record)
    else:
        proxy = record["proxy"]
        log(f"proxy (any Redis client): {proxy['host']}:{proxy['port']}   smart clients: BKV.SHARDMAP")
        _status_table(spec.data_dir)
    if foreground:
        log("running in the foreground; Ctrl-C stops the cluster")
        stop_signals = {signal.SIGINT, signal.SIGTERM}
        signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)  # sigwait takes them, not the default action
        try:
            signal.sigwait(stop_signals)
        finally:
            processes.down(spec.data_dir)


@app.command()
def down(data_dir: Path = DATA_DIR, verbose: bool = verbose_option(), quiet: bool = quiet_option()) -> None:
    """Stop every process of the recorded cluster (data stays on disk)."""
    set_verbosity(verbose, quiet)
    stopped = processes.down(resolve_data_dir(data_dir))
    log(f"stopped {len(stopped)} processes")


@app.command()
def status(data_dir: Path = DATA_DIR, as_json: bool = json_option(),
           verbose: bool = verbose_option(), quiet: bool = quiet_option()) -> None:
    """Ping every node and show its role, counters and restarts (exit 1 if any is down, or the
    supervisor is not running)."""
    set_verbosity(verbose, quiet)
    rows = processes.status(resolve_data_dir(data_dir))
    if as_json:
        emit_json(rows)
    else:
        _status_table(resolve_data_dir(data_dir), rows)
    sup = processes.supervisor_status(resolve_data_dir(data_dir))
    down_nodes = [r["name"] for r in rows if not r["up"]] + (["supervisor"] if sup and not sup["up"] else [])
    if down_nodes:
        raise RuntimeFailure(f"not answering: {', '.join(down_nodes)}")


def _status_table(data_dir: Path, rows: list | None = None) -> None:
    rows = rows if rows is not None else processes.status(data_dir)
    emit_table(make_table("bespokv cluster", ["node", "endpoint", "pid", "up", "role", "epoch", "state",
                                              "commands", "keys", "restarts"],
                          [[r["name"], r["endpoint"], r["pid"] or "-", "yes" if r["up"] else "NO",
                            r.get("role", "-"), r.get("epoch", "-"), r.get("state", "-"), r.get("commands", "-"),
                            r.get("keys", "-"), r.get("restarts", 0)] for r in rows]))
    stores = processes.store_status(data_dir)
    if stores:
        emit_table(make_table("redis-servers (redis datalet)", ["node", "endpoint", "pid", "up", "restarts"],
                              [[s["node"], s["endpoint"], s["pid"], "yes" if s["up"] else "NO", s["restarts"]]
                               for s in stores]))
    coord = processes.coordinator_status(data_dir)
    if coord is not None:
        emit_table(make_table("coordinator", ["endpoint", "pid", "up", "epoch", "state"],
                              [[coord["endpoint"], coord["pid"] or "-", "yes" if coord["up"] else "NO",
                                coord.get("epoch", "-"), coord.get("state", "-")]]))
    sup = processes.supervisor_status(data_dir)
    if sup is not None:
        emit_table(make_table("supervisor", ["pid", "up", "restarts made", "state"],
                              [[sup["pid"], "yes" if sup["up"] else "NO", sup["restarts"], sup["state"]]]))


@app.command()
def switch(topology: str = typer.Option(..., "--topology", help="ms (master-slave) or aa (active-active)."),
           consistency: str = typer.Option(..., "--consistency", help="strong or eventual."),
           timeout: float = typer.Option(30.0, "--timeout", help="Seconds to wait for every node to settle."),
           data_dir: Path = DATA_DIR, as_json: bool = json_option(),
           verbose: bool = verbose_option(), quiet: bool = quiet_option()) -> None:
    """Switch the running cluster to another controlet, live, without moving data.

    The coordinator commits the new controlet as the next epoch; nodes rebuild their controlets
    from their state; operations waiting at that moment fail with a retriable -TRYAGAIN. Returns
    once every node serves under the new map. All 12 transitions among ms-sc, ms-ec, aa-sc and aa-ec:
    into aa-ec the replicas first align with the old origin's state; out of it the new origin first
    gathers every replica's newer writes and the others copy it (a data copy, unlike the others)."""
    from mlsyskit.tools.kv.coord.spec import CoordinatorSpec
    from mlsyskit.tools.kv.ops.switch import switch as live_switch

    set_verbosity(verbose, quiet)
    record = processes.load_record(resolve_data_dir(data_dir))
    if not record.get("coordinator"):
        raise UsageError("this cluster runs without a coordinator (up --coordinator none): nothing can switch it")
    target = controlet_name(topology, consistency)
    log(f"switching to {target} ...")
    result = live_switch(CoordinatorSpec.from_dict(record["coordinator"]), target, timeout=timeout,
                         password=processes.read_password(resolve_data_dir(data_dir)))
    if as_json:
        emit_json(result.as_dict())
    else:
        emit_table(make_table("bespokv switch", ["from", "to", "epoch", "committed s", "settled s"],
                              [[result.before, result.after, result.epoch, result.committed_s,
                                result.settled_s]]))


app.command()(get)
app.command()(put)
app.command("del")(delete)
app.command()(shardmap)
app.command()(bench)


@app.command()
def check(mode: str = typer.Option(None, "--mode", help="Controlet under test: ms-sc (default), ms-ec, aa-sc, aa-ec."),
          nemesis: str = typer.Option(None, "--nemesis",
                                      help="Faults, comma-separated: kill, pause, partition, restart, "
                                           "coordinator-kill, or none (default the first four)."),
          ops: int = typer.Option(None, "--ops", help="At least this many operations; the run also lasts "
                                                      "until every requested fault has happened (2000)."),
          clients: int = typer.Option(None, "--clients", help="Concurrent clients (10)."),
          keys: int = typer.Option(None, "--keys", help="Register keys the clients share (10)."),
          shards: int = typer.Option(None, "--shards", help="Shards (1)."),
          replicas: int = typer.Option(None, "--replicas", help="Replicas per shard (3)."),
          datalet: str = typer.Option(None, "--datalet", help="memory (default; a killed node restarts empty) "
                                                              "or lmdb."),
          timeout: float = typer.Option(None, "--timeout", help="Seconds a client waits for an answer (2.5)."),
          coordinator: str = typer.Option(None, "--coordinator",
                                          help="none (default: no failover), embedded, or "
                                               "zookeeper://HOST:PORT/ROOT: nodes heartbeat, fail over, rejoin."),
          heartbeat: float = typer.Option(None, "--heartbeat", help="With a coordinator: heartbeat interval, "
                                                                    "s (0.5; failed after >= 8 intervals, 4 s)."),
          history: Path = typer.Option(None, "--history", dir_okay=False,
                                       help="Re-check a saved history.jsonl instead of running a cluster."),
          seed: int = seed_option(None, "Master seed of the workload and the nemesis schedule (0)."),
          out: Path = out_option("history.jsonl (every operation), result.json (the verdict), "
                                 "cluster/ (node logs); default bespokv-check/MODE-seedS"),
          config: Path = config_option(), as_json: bool = json_option(),
          verbose: bool = verbose_option(), quiet: bool = quiet_option()) -> None:
    """Jepsen-style consistency check: clients with unique values, a nemesis, then heal and verify.

    Strong modes must be linearizable (Wing-Gong-Lowe per key) with every acknowledged write
    readable; eventual modes must converge within 5 s of quiescence; no mode may lose an
    acknowledged write. Exit 1 when a check fails. Config file keys: the option names
    (nemesis as a list), plus hold and gap (min, max seconds of a fault and between faults)."""
    from mlsyskit.tools.kv.check import report
    from mlsyskit.tools.kv.check.nemesis import parse_faults
    from mlsyskit.tools.kv.check.runner import CheckSpec, recheck, run_check

    set_verbosity(verbose, quiet)
    if history is not None:
        if not history.is_file():
            raise UsageError(f"--history {history}: no such file")
        result = recheck(history, mode or "ms-sc")
        report.emit(result, as_json)
        report.raise_if_invalid(result)
        return
    try:
        faults = parse_faults(nemesis) if nemesis is not None else None
    except ValueError as e:
        raise UsageError(str(e)) from None
    spec = load_command_config(CheckSpec, config, {
        "mode": mode, "nemesis": faults, "ops": ops, "clients": clients, "keys": keys, "seed": seed,
        "shards": shards, "replicas": replicas, "datalet": datalet, "timeout": timeout,
        "coordinator": coordinator, "heartbeat": heartbeat})
    out_dir = ensure_out_dir(out if out is not None else Path("bespokv-check") / f"{spec.mode}-seed{spec.seed}")
    log(f"bespokv check --mode {spec.mode} --nemesis {','.join(spec.nemesis) or 'none'} --seed {spec.seed} "
        f"(rerun with this seed to replay the schedule)")
    with reporter() as rep:
        rep.phase("starting the cluster")
        ticks = {"started": False}

        def progress(done: int) -> None:
            if not ticks["started"]:
                ticks["started"] = True
                rep.start(f"operations (at least {spec.ops})", total=None, unit="op")
            rep.update(completed=done)
        result = asyncio.run(run_check(spec, out_dir, log=log, progress=progress))
    report.emit(result, as_json)
    report.raise_if_invalid(result)


@app.command()
def supervise(data_dir: Path = DATA_DIR,
              foreground: bool = typer.Option(False, "--foreground",
                                              help="Run the supervisor in this process (until SIGTERM/Ctrl-C)."),
              verbose: bool = verbose_option(), quiet: bool = quiet_option()) -> None:
    """Start the cluster's supervisor again (after it died; `status` shows it), detached.

    `up` starts one by default; it restarts a node whose process died once the coordinator has
    failed it over (empty: it copies the state from a survivor), kills and replaces a node that
    was SIGSTOPped long enough to be replaced, and gives up on a crash loop. Log:
    <data-dir>/logs/supervisor.log."""
    from mlsyskit.tools.kv.ops import supervisor

    set_verbosity(verbose, quiet)
    if foreground:
        supervisor.serve(resolve_data_dir(data_dir))
        return
    pid = supervisor.start(resolve_data_dir(data_dir))
    log(f"supervisor started (pid {pid}); log: {resolve_data_dir(data_dir)}/logs/supervisor.log")


@app.command(hidden=True)
def node(node_id: str, data_dir: Path = DATA_DIR) -> None:
    """Run one node of the recorded cluster (started by `up`)."""
    from mlsyskit.tools.kv.ops.nodeproc import serve_node

    serve_node(resolve_data_dir(data_dir), node_id)


@app.command(hidden=True)
def proxy(data_dir: Path = DATA_DIR) -> None:
    """Run the recorded cluster's proxy (started by `up`)."""
    from mlsyskit.tools.kv.ops.nodeproc import serve_node

    serve_node(resolve_data_dir(data_dir), None)


def main() -> None:
    run_app(app)


if __name__ == "__main__":
    main()
