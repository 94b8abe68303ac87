"""bespokv's client commands: finding the cluster, get/put/del/shardmap, and the YCSB bench.

Client commands find the cluster from --host/--port (--host needs --port), else --data-dir's
record, else MLSYSKIT_BESPOKV_ADDR=HOST:PORT, else the record under ./.bespokv; never a
guessed port. The options shared with the lifecycle commands (cli.py) are defined here.
"""
from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import typer

from mlsyskit.core.cli import (
    config_option,
    json_option,
    load_command_config,
    quiet_option,
    seed_option,
    verbose_option,
)
from mlsyskit.core.console import debug, emit_json, emit_table, make_table, reporter, set_verbosity
from mlsyskit.core.errors import RuntimeFailure, UsageError
from mlsyskit.tools.kv.client.call import call
from mlsyskit.tools.kv.client.mapfollow import FollowingClient, retrying
from mlsyskit.tools.kv.client.smart import KVError
from mlsyskit.tools.kv.ops import processes
from mlsyskit.tools.kv.shardmap import ShardMap

ADDR_ENV = "MLSYSKIT_BESPOKV_ADDR"
DEFAULT_DATA_DIR = Path(".bespokv")
DATA_DIR = typer.Option(None, "--data-dir", help="Where the cluster record, logs and data live (default .bespokv).")
HOST = typer.Option(None, "--host", help="Any node or the proxy; needs --port.")
PORT = typer.Option(None, "--port", help="Port of --host (default host 127.0.0.1).")
PASSWORD_ENV = "MLSYSKIT_BESPOKV_PASSWORD"
PASSWORD = typer.Option(None, "--password", envvar=PASSWORD_ENV, show_envvar=False,
                        help=f"The cluster's requirepass (or ${PASSWORD_ENV}; default: <data-dir>/requirepass).")
RETRY_FOR = typer.Option(10.0, "--retry-for", min=0.0,
                         help="Seconds to retry retriable answers (a failover, a replica that has just joined: "
                              "-TRYAGAIN, -CLUSTERDOWN, an unreachable node); 0: one try.")


def resolve_data_dir(data_dir: Path | None) -> Path:
    return data_dir if data_dir is not None else DEFAULT_DATA_DIR


# -- finding the cluster -------------------------------------------------------------
def parse_addr(text: str, what: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"{what} wants HOST:PORT, got {text!r}")
    return host, int(port)


def cluster_address(data_dir: Path | None, host: str | None, port: int | None) -> tuple[str, int]:
    """--host/--port, else --data-dir's record, else $MLSYSKIT_BESPOKV_ADDR, else ./.bespokv's record."""
    if host is not None and port is None:
        raise UsageError("--host needs --port (bespokv has no default port)")
    if port is not None:
        if not 0 < port < 65536:
            raise UsageError(f"--port must be 1..65535, got {port}")
        return host or "127.0.0.1", port
    if data_dir is None and os.environ.get(ADDR_ENV):
        return parse_addr(os.environ[ADDR_ENV], ADDR_ENV)
    proxy = processes.load_record(resolve_data_dir(data_dir))["proxy"]
    return proxy["host"], proxy["port"]


def cluster_password(data_dir: Path | None, password: str | None) -> bytes | None:
    """--password (or its env var), else the password file of --data-dir (or ./.bespokv)."""
    if password is not None:
        return password.encode()
    return processes.read_password(resolve_data_dir(data_dir))


def fetch_map(host: str, port: int, password: bytes | None = None) -> ShardMap:
    debug(f"fetching the shard map from {host}:{port}")
    try:
        return ShardMap.from_json(call(host, port, "BKV.SHARDMAP", password=password))
    except OSError as e:
        if str(e).startswith(("NOAUTH", "WRONGPASS")):
            raise RuntimeFailure(f"bespokv at {host}:{port} refused: {e} (give --password or "
                                 f"${PASSWORD_ENV}, or --data-dir of the cluster)") from None
        raise RuntimeFailure(f"cannot reach bespokv at {host}:{port}: {e}") from None


def _kv(fn, data_dir: Path | None, host: str | None, port: int | None, password: str | None,
        retry_for: float, idempotent: bool = True):
    """Run fn(client) against the cluster, following its map and retrying what is retriable for up
    to `retry_for` s (mapfollow.retrying): a failover or a just-joined replica answers -TRYAGAIN briefly."""
    secret = cluster_password(data_dir, password)
    address = cluster_address(data_dir, host, port)
    smap = fetch_map(*address, password=secret)

    async def current() -> ShardMap:
        return await asyncio.to_thread(fetch_map, *address, password=secret)

    async def body():
        client = FollowingClient(smap, current, timeout=10.0, password=secret)
        try:
            return await retrying(lambda: fn(client), idempotent, within_s=retry_for)
        finally:
            await client.close()

    try:
        return asyncio.run(body())
    except KVError as e:
        raise RuntimeFailure(f"the cluster answered: {e}") from None
    except TimeoutError:
        raise RuntimeFailure("the cluster did not answer within 10 s") from None
    except OSError as e:  # the seed answered but the key's node did not (stopped, or not yet up)
        raise RuntimeFailure(f"a node of the cluster is unreachable: {e}") from None


def get(key: str, data_dir: Path = DATA_DIR, host: str = HOST, port: int = PORT, password: str = PASSWORD,
        retry_for: float = RETRY_FOR, as_json: bool = json_option(), verbose: bool = verbose_option(),
        quiet: bool = quiet_option()) -> None:
    """Print the value of KEY (exit 1 if it does not exist)."""
    set_verbosity(verbose, quiet)
    value = _kv(lambda c: c.get(key.encode()), data_dir, host, port, password, retry_for)
    text = None if value is None else value.decode(errors="backslashreplace")
    if as_json:
        emit_json({"key": key, "value": text})
    elif text is not None:
        typer.echo(text)
    if value is None:
        raise RuntimeFailure(f"(nil): no key {key!r}")


def put(key: str, value: str, data_dir: Path = DATA_DIR, host: str = HOST, port: int = PORT,
        password: str = PASSWORD, retry_for: float = RETRY_FOR, as_json: bool = json_option(),
        verbose: bool = verbose_option(), quiet: bool = quiet_option()) -> None:
    """Set KEY to VALUE."""
    set_verbosity(verbose, quiet)
    _kv(lambda c: c.put(key.encode(), value.encode()), data_dir, host, port, password, retry_for)
    if as_json:
        emit_json({"key": key, "ok": True})
    else:
        typer.echo("OK")


def delete(key: str, data_dir: Path = DATA_DIR, host: str = HOST, port: int = PORT, password: str = PASSWORD,
           retry_for: float = RETRY_FOR, as_json: bool = json_option(), verbose: bool = verbose_option(),
           quiet: bool = quiet_option()) -> None:
    """Delete KEY; prints 1 if it existed, else 0."""
    set_verbosity(verbose, quiet)
    # not idempotent in what it reports: after an unknown outcome a second DEL would say 0
    existed = _kv(lambda c: c.delete(key.encode()), data_dir, host, port, password, retry_for, idempotent=False)
    if as_json:
        emit_json({"key": key, "existed": existed})
    else:
        typer.echo("1" if existed else "0")


def shardmap(data_dir: Path = DATA_DIR, host: str = HOST, port: int = PORT, password: str = PASSWORD,
             verbose: bool = verbose_option(), quiet: bool = quiet_option()) -> None:
    """Print the shard map (epoch, controlet, datalet, replicas per shard, node addresses) as JSON."""
    set_verbosity(verbose, quiet)
    typer.echo(json.dumps(fetch_map(*cluster_address(data_dir, host, port),
                                     password=cluster_password(data_dir, password)).to_dict(), indent=2))


def bench(workload: str = typer.Option(None, "--workload", help="ycsb-a (default), ycsb-b, ycsb-c or ycsb-f."),
          keys: int = typer.Option(None, "--keys", help="Key space size, loaded before the measured run (10000)."),
          ops: int = typer.Option(None, "--ops", help="Operations in the measured run (20000)."),
          zipf: float = typer.Option(None, "--zipf", help="Zipfian theta, 0 = uniform (0.99)."),
          value_size: int = typer.Option(None, "--value-size", help="Bytes per value (32)."),
          clients: int = typer.Option(None, "--clients", help="Concurrent client connections (16)."),
          window: int = typer.Option(None, "--window", help="Operations each client keeps outstanding (1)."),
          seed: int = seed_option(None, "Seed of the operation mix and key choice (0)."),
          redis: str = typer.Option(None, "--redis", help="Bench Redis instead: host:port[,host:port...] "
                                                          "(primary first, then its replicas)."),
          wait: int = typer.Option(0, "--wait", help="With --redis: WAIT for this many replicas after writes."),
          primary_reads: bool = typer.Option(False, "--primary-reads",
                                             help="With --redis: read at the primary only (default: spread)."),
          data_dir: Path = DATA_DIR, host: str = HOST, port: int = PORT, password: str = PASSWORD,
          config: Path = config_option(), as_json: bool = json_option(),
          verbose: bool = verbose_option(), quiet: bool = quiet_option()) -> None:
    """YCSB-style load: throughput and p50/p99/p999 latency (load phase, then the measured run).

    Config file keys: name, keys, ops, zipf, value_size, clients, seed, load, window."""
    from mlsyskit.tools.kv.client import ycsb  # numpy: loaded only for a bench, not for every node process

    set_verbosity(verbose, quiet)
    w = load_command_config(ycsb.Workload, config, {
        "name": workload, "keys": keys, "ops": ops, "zipf": zipf, "value_size": value_size,
        "clients": clients, "seed": seed, "window": window})
    if redis:
        endpoints = [parse_addr(e, "--redis") for e in redis.split(",")]
        make, target = ycsb.redis_target_factory(endpoints, wait, not primary_reads), f"redis {redis}"
    else:
        secret = cluster_password(data_dir, password)
        smap = fetch_map(*cluster_address(data_dir, host, port), password=secret)

        async def make(s: int):
            return await ycsb.bespokv_target(smap, s, secret)
        target = f"bespokv {smap.controlet}/{smap.datalet} {len(smap.shards)}x{len(smap.shards[0])}"
    with reporter() as rep:
        rep.start(f"{w.name} on {target}", total=w.ops, unit="op")
        try:
            result = asyncio.run(ycsb.run_workload(w, make, on_progress=lambda i: rep.update(completed=i)))
        except OSError as e:  # refused at connect, or a server went away mid-run
            raise RuntimeFailure(f"bench against {target} failed: {e}") from None
        rep.update(completed=w.ops)
    result["target"] = target
    if as_json:
        emit_json(result)
    else:
        emit_table(make_table(f"{w.name} on {target}", ["ops/s", "p50 ms", "p99 ms", "p999 ms", "errors"],
                              [[result["ops_per_s"], result["p50_ms"], result["p99_ms"], result["p999_ms"],
                                result["errors"]]]))
