"""A ZooKeeper-backed coordinator process: `python -m mlsyskit.tools.kv.coord.zk_main --zk HOSTS`.

It campaigns in the leader lock under --root (every other instance is a standby blocked in the
same lock); once leading it prints `leading <name> epoch <E>` on stdout and fails over nodes
whose ephemeral znodes have been gone for the detector's timeout. Nodes register themselves
with ZooKeeper directly (ZkCoordinator.register on their own session). Losing the ZooKeeper
session means losing leadership: the process exits 1 so that a supervisor restarts it as a
standby, rather than acting on a lock it no longer holds.
"""
from __future__ import annotations

import os
from pathlib import Path

import typer

from mlsyskit.core.cli import env_prefix, quiet_option, run_app, verbose_option
from mlsyskit.core.clock import RealClock
from mlsyskit.core.console import log, set_verbosity, warn
from mlsyskit.core.errors import RuntimeFailure, UsageError
from mlsyskit.tools.kv.coord.detector import DetectorConfig
from mlsyskit.tools.kv.coord.watcher import LiveListFailover
from mlsyskit.tools.kv.coord.zk import KazooException, ZkCoordinator
from mlsyskit.tools.kv.peerauth import read_secret

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None,
                  help="The ZooKeeper-backed bespokv coordinator (leader or standby).",
                  context_settings={"help_option_names": ["-h", "--help"],
                                    "auto_envvar_prefix": env_prefix("bespokv-zk-coord")})


@app.command()
def main(zk: str = typer.Option(..., help="ZooKeeper connect string, host:port,host:port,..."),
         root: str = typer.Option("/bespokv", help="Root znode of this cluster's metadata."),
         name: str = typer.Option("", help="This coordinator's name in the leader lock (default pid)."),
         session_timeout: float = typer.Option(4.0, help="ZooKeeper session timeout, seconds."),
         connect_timeout: float = typer.Option(10.0, help="Give up when ZooKeeper does not answer, seconds."),
         interval: float = typer.Option(0.25, help="How often the live list is checked, seconds."),
         misses: int = typer.Option(2, help="Checks a node may be absent before it is failed over."),
         secret_file: Path = typer.Option(None, help="The cluster secret (hex; `bespokv up` passes "
                                                      "<data-dir>/cluster.secret): digest auth, and ACLs "
                                                      "that shut out clients without it."),
         verbose: bool = verbose_option(), quiet: bool = quiet_option()) -> None:
    set_verbosity(verbose, quiet)
    # the session timeout is the floored failure timeout already: absence is judged as before
    config = DetectorConfig(interval_s=interval, misses=misses, min_timeout_s=0.0)   # validates first
    clock = RealClock()
    try:
        secret = read_secret(secret_file) if secret_file is not None else None
    except (OSError, ValueError) as e:
        raise UsageError(f"--secret-file {secret_file}: {e}") from None
    coord = ZkCoordinator(zk, root, session_timeout_s=session_timeout, connect_timeout_s=connect_timeout,
                          secret=secret)
    name = name or f"zk-coord/{os.getpid()}"
    try:
        if not coord.campaign(name, timeout_s=0):
            log(f"standby {name}: waiting in the leader lock under {root}")
            if not coord.campaign(name, timeout_s=None):
                raise RuntimeFailure(f"{name} could not wait in the leader lock (ZooKeeper connection lost)")
        loop = LiveListFailover(coord, clock, config)
        loop.takeover()
        current = coord.read_map()
        print(f"leading {name} epoch {None if current is None else current.epoch}", flush=True)
        while coord.is_leader():
            try:
                loop.step()
            except KazooException as e:   # connection loss while ZooKeeper re-elects: retry next round
                warn(f"ZooKeeper call failed ({type(e).__name__}); retrying")
            clock.sleep(interval)
        raise RuntimeFailure(f"{name} lost its ZooKeeper session and with it the leadership")
    finally:
        coord.close()


if __name__ == "__main__":
    run_app(app)
