"""bespokv command line."""
from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path

import typer

from mlsyskit.core.cli import fail, make_app, run_app
from mlsyskit.core.config import ConfigError
from mlsyskit.core.console import emit_json, emit_table, err, make_table, progress
from mlsyskit.tools.kv import processes
from mlsyskit.tools.kv.client import KVError, SmartClient
from mlsyskit.tools.kv.controlets import controlet_name
from mlsyskit.tools.kv.shardmap import ShardMap

app = make_app(
    "bespokv",
    "Scale-out KV store framework (after bespoKV, SC'18): turns a single-server KV store (a datalet) into "
    "a sharded, replicated store by picking controlets for topology (master-slave / active-active) and "
    "consistency (strong / eventual), spoken to over the Redis protocol.",
)

DATA_DIR = typer.Option(Path(".bespokv"), "--data-dir", help="Where the cluster record, logs and data live.")
HOST = typer.Option(None, "--host", help="Any node or the proxy (default: the recorded cluster's proxy).")
PORT = typer.Option(None, "--port", help="Port for --host.")


@app.command()
def up(shards: int = typer.Option(1, "--shards", help="Number of shards S."),
       replicas: int = typer.Option(1, "--replicas", help="Replicas per shard R."),
       topology: str = typer.Option("ms", "--topology", help="ms (master-slave) or aa (active-active)."),
       consistency: str = typer.Option("strong", "--consistency", help="strong or eventual."),
       datalet: str = typer.Option("memory", "--datalet", help="memory, lmdb or redis."),
       base_port: int = typer.Option(7000, "--base-port", help="Proxy on P, nodes on P+1..., redis datalets after."),
       data_dir: Path = DATA_DIR,
       foreground: bool = typer.Option(False, "--foreground", help="Stay attached; Ctrl-C stops the cluster."),
       as_json: bool = typer.Option(False, "--json", help="Print the record as JSON.")) -> None:
    """Start a cluster on loopback, wait until every process answers, print endpoints and status."""
    spec = processes.ClusterSpec(shards=shards, replicas=replicas, controlet=controlet_name(topology, consistency),
                                 datalet=datalet, base_port=base_port, data_dir=data_dir)
    err.print(f"starting {shards}x{replicas} {spec.controlet} cluster on the {datalet} datalet ...")
    record = processes.up(spec)
    if as_json:
        emit_json(record)
    else:
        proxy = record["proxy"]
        err.print(f"proxy (any Redis client): {proxy['host']}:{proxy['port']}   smart clients: BKV.SHARDMAP")
        _status_table(data_dir)
    if foreground:
        err.print("running in the foreground; Ctrl-C stops the cluster")
        stop_signals = {signal.SIGINT, signal.SIGTERM}
        signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)  # sigwait takes them, not the default action
        try:
            signal.sigwait(stop_signals)
        finally:
            processes.down(data_dir)


@app.command()
def down(data_dir: Path = DATA_DIR) -> None:
    """Stop every process of the recorded cluster (data stays on disk)."""
    stopped = processes.down(data_dir)
    err.print(f"stopped {len(stopped)} processes")


@app.command()
def status(data_dir: Path = DATA_DIR,
           as_json: bool = typer.Option(False, "--json", help="Print the rows as JSON on stdout.")) -> None:
    """Ping every node and show its role and counters (exit 1 if any is down)."""
    rows = processes.status(data_dir)
    if as_json:
        emit_json(rows)
    else:
        _status_table(data_dir, rows)
    if not all(r["up"] for r in rows):
        raise typer.Exit(1)


def _status_table(data_dir: Path, rows: list | None = None) -> None:
    rows = rows if rows is not None else processes.status(data_dir)
    emit_table(make_table("bespokv cluster", ["node", "endpoint", "pid", "up", "role", "commands", "keys"],
                          [[r["name"], r["endpoint"], r["pid"] or "-", "yes" if r["up"] else "NO",
                            r.get("role", "-"), r.get("commands", "-"), r.get("keys", "-")] for r in rows]))


def _seed(data_dir: Path, host: str | None, port: int | None) -> tuple[str, int]:
    if host is not None or port is not None:
        return host or "127.0.0.1", port or 6379
    proxy = processes.load_record(data_dir)["proxy"]
    return proxy["host"], proxy["port"]


async def _with_client(data_dir: Path, host: str | None, port: int | None, fn):
    h, p = _seed(data_dir, host, port)
    try:
        client = await SmartClient.connect(h, p)
    except OSError as e:
        raise ConfigError(f"cannot reach bespokv at {h}:{p}: {e}") from None
    try:
        return await fn(client)
    finally:
        await client.close()


def _kv(fn, data_dir: Path, host: str | None, port: int | None):
    try:
        return asyncio.run(_with_client(data_dir, host, port, fn))
    except KVError as e:
        raise fail(str(e)) from None
    except OSError as e:  # the seed answered but the key's node did not (stopped, or not yet up)
        raise fail(f"a node of the cluster is unreachable: {e}") from None


@app.command()
def get(key: str, data_dir: Path = DATA_DIR, host: str = HOST, port: int = PORT) -> None:
    """Print the value of KEY (exit 1 if it does not exist)."""
    value = _kv(lambda c: c.get(key.encode()), data_dir, host, port)
    if value is None:
        err.print("(nil)")
        raise typer.Exit(1)
    typer.echo(value.decode(errors="backslashreplace"))


@app.command()
def put(key: str, value: str, data_dir: Path = DATA_DIR, host: str = HOST, port: int = PORT) -> None:
    """Set KEY to VALUE."""
    _kv(lambda c: c.put(key.encode(), value.encode()), data_dir, host, port)
    typer.echo("OK")


@app.command("del")
def delete(key: str, data_dir: Path = DATA_DIR, host: str = HOST, port: int = PORT) -> None:
    """Delete KEY; prints 1 if it existed, else 0."""
    existed = _kv(lambda c: c.delete(key.encode()), data_dir, host, port)
    typer.echo("1" if existed else "0")


@app.command()
def bench(workload: str = typer.Option("ycsb-a", "--workload", help="ycsb-a, ycsb-b, ycsb-c or ycsb-f."),
          keys: int = typer.Option(10_000, "--keys", help="Key space size (loaded before the measured run)."),
          ops: int = typer.Option(20_000, "--ops", help="Operations in the measured run."),
          zipf: float = typer.Option(0.99, "--zipf", help="Zipfian theta (0 = uniform)."),
          value_size: int = typer.Option(32, "--value-size", help="Bytes per value."),
          clients: int = typer.Option(16, "--clients", help="Concurrent client connections."),
          window: int = typer.Option(1, "--window", help="Operations each client keeps outstanding."),
          seed: int = typer.Option(0, "--seed", help="Seed of the operation mix and key choice."),
          redis: str = typer.Option(None, "--redis", help="Bench Redis instead: host:port[,host:port...] "
                                                          "(primary first, then its replicas)."),
          wait: int = typer.Option(0, "--wait", help="With --redis: WAIT for this many replicas after writes."),
          primary_reads: bool = typer.Option(False, "--primary-reads",
                                             help="With --redis: read at the primary only (default: spread)."),
          data_dir: Path = DATA_DIR, host: str = HOST, port: int = PORT,
          as_json: bool = typer.Option(False, "--json", help="Print the result as JSON on stdout.")) -> None:
    """YCSB-style load: throughput and p50/p99/p999 latency (load phase, then the measured run)."""
    from mlsyskit.tools.kv import ycsb

    w = ycsb.Workload(name=workload, keys=keys, ops=ops, zipf=zipf, value_size=value_size, clients=clients,
                      seed=seed, window=window)
    if redis:
        try:
            endpoints = [(h, int(p)) for h, p in (e.rsplit(":", 1) for e in redis.split(","))]
        except ValueError:
            raise fail(f"--redis wants host:port[,host:port...], got {redis!r}") from None
        make, target = ycsb.redis_target_factory(endpoints, wait, not primary_reads), f"redis {redis}"
    else:
        h, p = _seed(data_dir, host, port)
        try:
            text = processes.sync_call(h, p, "BKV.SHARDMAP")
        except OSError as e:
            raise fail(f"cannot reach bespokv at {h}:{p}: {e}") from None
        smap = ShardMap.from_json(text)

        async def make(s: int):
            return await ycsb.bespokv_target(smap, s)
        target = f"bespokv {smap.controlet}/{smap.datalet} {len(smap.shards)}x{len(smap.shards[0])}"
    with progress() as bar:
        task = bar.add_task(f"{workload} on {target}", total=ops)
        try:
            result = asyncio.run(ycsb.run_workload(w, make, on_progress=lambda i: bar.update(task, completed=i)))
        except OSError as e:  # refused at connect, or a server went away mid-run
            raise fail(f"bench against {target} failed: {e}") from None
        bar.update(task, completed=ops)
    result["target"] = target
    if as_json:
        emit_json(result)
    else:
        emit_table(make_table(f"{workload} on {target}", ["ops/s", "p50 ms", "p99 ms", "p999 ms", "errors"],
                              [[result["ops_per_s"], result["p50_ms"], result["p99_ms"], result["p999_ms"],
                                result["errors"]]]))


@app.command(hidden=True)
def node(node_id: str, data_dir: Path = DATA_DIR) -> None:
    """Run one node of the recorded cluster (started by `up`)."""
    processes.serve_node(data_dir, node_id)


@app.command(hidden=True)
def proxy(data_dir: Path = DATA_DIR) -> None:
    """Run the recorded cluster's proxy (started by `up`)."""
    processes.serve_node(data_dir, None)


@app.command()
def shardmap(data_dir: Path = DATA_DIR, host: str = HOST, port: int = PORT) -> None:
    """Print the shard map (epoch, controlet, datalet, replicas per shard, node addresses) as JSON."""
    h, p = _seed(data_dir, host, port)
    try:
        text = processes.sync_call(h, p, "BKV.SHARDMAP")
    except OSError as e:
        raise fail(f"cannot reach bespokv at {h}:{p}: {e}") from None
    typer.echo(json.dumps(json.loads(text), indent=2))


def main() -> None:
    run_app(app)


if __name__ == "__main__":
    main()
