"""The embedded coordinator as a process: `python -m mlsyskit.tools.kv.coord.server --state-dir DIR --port P`.

It first campaigns for the SQLite leader lock of DIR (a second process on the same DIR is a
standby: it waits, bound to nothing, and takes over when the leader dies, even by kill -9),
then serves the line-JSON protocol (protocol.py) on host:port and, every half heartbeat
interval, fails over the nodes whose heartbeats stopped. All state is in DIR/coord.db, so a
restarted coordinator resumes at the same epoch. Humans' lines go to stderr; the single line
`serving <host> <port> epoch <E>` on stdout says it is ready.
"""
from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import typer

from mlsyskit.core.cli import env_prefix, quiet_option, run_app, verbose_option
from mlsyskit.core.console import debug, log, set_verbosity, warn
from mlsyskit.core.errors import RuntimeFailure, UsageError
from mlsyskit.core.storage_errors import StorageError
from mlsyskit.tools.kv.coord.detector import DetectorConfig
from mlsyskit.tools.kv.coord.embedded import EmbeddedCoordinator
from mlsyskit.tools.kv.coord.failover import ShardLost
from mlsyskit.tools.kv.coord.orchestrator import fail_over
from mlsyskit.tools.kv.coord.protocol import MAX_LINE, Session
from mlsyskit.tools.kv.peerauth import read_secret

# One command, no sub-commands (make_app's version callback would turn it into a group).
app = typer.Typer(add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None,
                  help="The embedded bespokv coordinator (leader or standby).",
                  context_settings={"help_option_names": ["-h", "--help"],
                                    "auto_envvar_prefix": env_prefix("bespokv-coord")})


async def _serve_client(coord: EmbeddedCoordinator, secret: bytes | None, reader: asyncio.StreamReader,
                        writer: asyncio.StreamWriter) -> None:
    session = Session(secret)
    try:
        while True:
            try:
                line = await reader.readuntil(b"\n")
            except asyncio.LimitOverrunError:
                writer.write(b'{"ok": false, "kind": "bad_request", "error": "request line too long"}\n')
                break
            except asyncio.IncompleteReadError:
                break
            writer.write(json.dumps(session.handle(coord, line)).encode() + b"\n")
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()


async def _watch(coord: EmbeddedCoordinator) -> None:
    """Fail over silent nodes; a lost shard is reported, never emptied."""
    stalls = coord.detector.stalls
    while True:
        await asyncio.sleep(coord.detector.config.interval_s / 2)
        failed = coord.expire()
        if coord.detector.stalls != stalls:
            stalls = coord.detector.stalls
            warn("this coordinator was paused longer than the failure timeout: the pause is not counted "
                 "against the nodes' silence")
        if not failed:
            continue
        warn(f"no heartbeat from {', '.join(failed)} for {coord.detector.config.timeout_s:g} s")
        try:
            new = fail_over(coord, failed, coord.applied())
        except ShardLost as e:
            warn(f"cannot fail over: {e}")
            continue
        if new is not None:
            log(f"failover: epoch {new.epoch}, shards {[list(s) for s in new.shards]}")


async def _main(coord: EmbeddedCoordinator, host: str, port: int, secret: bytes | None) -> None:
    server = await asyncio.start_server(lambda r, w: _serve_client(coord, secret, r, w), host, port,
                                        limit=MAX_LINE)
    current = coord.read_map()
    epoch = None if current is None else current.epoch
    print(f"serving {host} {port} epoch {epoch}", flush=True)
    async with server:
        await asyncio.gather(server.serve_forever(), _watch(coord))


@app.command()
def main(state_dir: Path = typer.Option(..., help="Directory of coord.db and the leader lock."),
         port: int = typer.Option(..., help="TCP port to serve on once leading."),
         host: str = typer.Option("127.0.0.1", help="Address to bind."),
         name: str = typer.Option("", help="This coordinator's name in status (default host:port/pid)."),
         interval: float = typer.Option(0.5, help="Heartbeat interval nodes use, seconds."),
         misses: int = typer.Option(3, help="Missed heartbeats before a node is failed over."),
         min_timeout: float = typer.Option(None, help="... but never less silence than this, seconds "
                                                      "(default 8 intervals: a loaded host; detector.py)."),
         secret_file: Path = typer.Option(None, help="The cluster secret (hex; `bespokv up` passes "
                                                      "<data-dir>/cluster.secret): clients must prove it "
                                                      "before any request. Without it anyone who reaches "
                                                      "the port can change the shard map."),
         verbose: bool = verbose_option(), quiet: bool = quiet_option()) -> None:
    set_verbosity(verbose, quiet)
    if not 0 < port < 65536:
        raise UsageError(f"--port must be 1..65535, got {port}")
    secret = None
    if secret_file is not None:
        try:
            secret = read_secret(secret_file)
        except (OSError, ValueError) as e:
            raise UsageError(f"--secret-file {secret_file}: {e}") from None
    else:
        warn("no --secret-file: clients are not authenticated")
    detector = DetectorConfig(interval_s=interval, misses=misses, min_timeout_s=min_timeout)
    try:
        coord = EmbeddedCoordinator(state_dir, detector=detector)
    except (OSError, StorageError) as e:
        raise RuntimeFailure(f"cannot open the coordinator state in {state_dir}: {e}") from None
    name = name or f"{host}:{port}/{os.getpid()}"
    if not coord.campaign(name, timeout_s=0):
        log(f"standby {name}: waiting for the leader lock of {state_dir}")
        coord.campaign(name, timeout_s=None)
    log(f"{name} leads {state_dir}")
    debug(f"members: {sorted(coord.members())}")
    try:
        asyncio.run(_main(coord, host, port, secret))
    except KeyboardInterrupt:
        pass
    finally:
        coord.close()
        sys.stdout.flush()


if __name__ == "__main__":
    run_app(app)
