"""`fl-server simulate`: the server's round logic with in-process clients on a virtual clock.

A module-level command that server_cli.py adds to fl-server's app (`app.command()(simulate)`), so
the simulator's flags live next to the simulator; the options it shares with `run` are in
server_options.py.
"""
from __future__ import annotations

from pathlib import Path

import typer

from mlsyskit.core.cli import json_option, quiet_option, verbose_option
from mlsyskit.core.console import log, reporter, set_verbosity
from mlsyskit.core.errors import UsageError
from mlsyskit.tools.fl import server_options as opt
from mlsyskit.tools.fl.backend_choice import BACKEND_NAMES, make_backend
from mlsyskit.tools.fl.config import ATTACKS
from mlsyskit.tools.fl.coordinator import JobMismatch
from mlsyskit.tools.fl.plugins import UserCodeError
from mlsyskit.tools.fl.report import load_run, summarize
from mlsyskit.tools.fl.sim_world import WorldConfig
from mlsyskit.tools.fl.simulator import EVAL_CLIENTS, Simulation, SimulationOptions, choose_attackers
from mlsyskit.tools.fl.threads import single_threaded


def simulate(config: Path | None = opt.JOB_CONFIG, strategy: str | None = opt.STRATEGY,
             dataset: str | None = opt.DATASET, model: str | None = opt.MODEL,
             clients: int | None = opt.CLIENTS, per_round: int | None = opt.PER_ROUND,
             rounds: int | None = opt.ROUNDS, partition: str | None = opt.PARTITION,
             alpha: float | None = opt.ALPHA, seed: int | None = opt.SEED,
             malicious_fraction: float = typer.Option(0.0, "--malicious-fraction",
                                                      help="Fraction of clients that attack (0 to <1)."),
             attack: str = typer.Option("label-flip", "--attack", help="What the attackers do: " +
                                        " | ".join(a for a in ATTACKS if a != "none") + "."),
             dropout: float = typer.Option(0.0, "--dropout", help="Chance a selected client vanishes mid-round."),
             scheduler: str | None = opt.SCHEDULER,
             weights: str | None = typer.Option(None, "--weights", help="Free knob weights (fast, rfair, afair, "
                                                "perf, util = Oort's statistical utility) for fast|rfair|afair|"
                                                "perf|adaptive, e.g. fast=0.6,rfair=0.4 (replace the preset's)."),
             deadline: float | None = typer.Option(None, "--deadline", help="Per-round deadline, virtual seconds "
                                                   "(default: the scheduler's, capped by --round-timeout)."),
             round_timeout: float | None = typer.Option(None, "--round-timeout",
                                                        help="Hard per-round limit, virtual seconds (default 30)."),
             availability: str = typer.Option("always", "--availability", help="always | synthetic (on/off "
                                              "periods, exponential, mean 1800 s on / 600 s off) | a FedScale "
                                              "client behaviour trace (JSON or its pickle, data only)."),
             slowdown_fraction: float = typer.Option(0.0, "--slowdown-fraction",
                                                     help="Fraction of clients slowed 2-5x from a random time "
                                                          "in the first hour (changing resources mid-run)."),
             backend: str = typer.Option("inprocess", "--backend", help=f"Where clients train: "
                                         f"{' | '.join(BACKEND_NAMES)} (ray: joins --ray-address, else starts a "
                                         "local Ray for this run and stops it after)."),
             ray_address: str | None = typer.Option(None, "--ray-address",
                                                    help="Ray cluster to join with --backend ray (HOST:PORT or auto)."),
             eval_clients: int = typer.Option(EVAL_CLIENTS, "--eval-clients", help="Per-client accuracy at the end "
                                              "on every client up to this many, else on a seeded sample of them (each "
                                              "also trains its local-only baseline for the refunds)."),
             run_dir: Path = opt.run_dir_option("runs/fl-sim"),
             fresh: bool = opt.FRESH, json_out: bool = json_option(),
             verbose: bool = verbose_option(), quiet: bool = quiet_option()) -> None:
    """The same server logic with in-process clients on a virtual clock (deterministic for a seed)."""
    set_verbosity(verbose, quiet)
    job = opt.make_job(config, strategy, dataset, clients, per_round, rounds, partition, alpha, seed, model,
                       round_timeout_s=round_timeout)
    try:
        options = SimulationOptions(scheduler, parse_weights(weights), deadline_s=deadline,
                                    world=WorldConfig(availability=availability, slowdown_fraction=slowdown_fraction),
                                    eval_clients=eval_clients)
        options.make_scheduler()  # refuse a bad name or weights before any work
    except (KeyError, ValueError) as e:
        raise UsageError(str(e).strip("'\"")) from None
    if deadline is not None and deadline <= 0 or eval_clients < 1:
        raise UsageError("--deadline must be positive and --eval-clients at least 1")
    if attack not in ATTACKS or attack == "none":
        raise UsageError(f"--attack must be one of {', '.join(a for a in ATTACKS if a != 'none')}, got {attack!r}")
    if not 0 <= malicious_fraction < 1 or not 0 <= dropout < 1:
        raise UsageError("--malicious-fraction and --dropout must be in [0, 1)")
    attacks = choose_attackers(job.data.num_clients, malicious_fraction, attack, job.seed)
    single_threaded()
    try:
        trainer = make_backend(backend, ray_address)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if getattr(trainer, "started_local", False):
        log("no Ray cluster given or running: started a local Ray for this run (stopped at its end)")
    store = opt.open_store(run_dir, fresh)
    try:
        with reporter() as rep:
            rep.phase(f"preparing {job.data.num_clients} clients (data, profiles and availability are lazy)")
            simulation = Simulation(job, store, attacks, dropout, trainer, options)
            simulation.run(on_round=opt.round_progress(rep, job.rounds), on_phase=rep.phase,
                           on_progress=end_progress(rep))
    except UserCodeError as e:
        raise opt.user_code_failed(e) from None
    except (JobMismatch, ValueError) as e:
        raise UsageError(str(e)) from None
    finally:
        trainer.close()
        store.close()
    opt.print_summary(summarize(load_run(run_dir)), json_out)


def end_progress(rep):
    """The end of the job (per-client evaluation, local-only baselines) as counted phases."""

    def on_progress(step: str, done: int, total: int) -> None:
        if done == 0:
            rep.start(step, total=total, unit="clients")
        else:
            rep.update(completed=done)

    return on_progress


def parse_weights(text: str | None) -> dict[str, float]:
    """`fast=0.6,rfair=0.4` -> {"fast": 0.6, "rfair": 0.4} (names and values are checked by HeteroConfig)."""
    if not text:
        return {}
    weights = {}
    for part in text.split(","):
        name, sep, value = part.partition("=")
        try:
            weights[name.strip()] = float(value)
        except ValueError:
            raise ValueError(f"--weights wants NAME=NUMBER pairs separated by commas, got {part!r}") from None
        if not sep:
            raise ValueError(f"--weights wants NAME=NUMBER pairs separated by commas, got {part!r}")
    return weights
