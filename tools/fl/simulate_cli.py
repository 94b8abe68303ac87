"""`fl-server simulate`: the server's round logic with in-process clients on a virtual clock.

Registered on fl-server's app by `register(app)` (called at the end of server_cli.py, whose shared
options and helpers it reuses), so the simulator's flags live next to the simulator.
"""
from __future__ import annotations

from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    from mlsyskit.core.cli import json_option, quiet_option, verbose_option
    from mlsyskit.core.console import reporter, set_verbosity
    from mlsyskit.core.errors import UsageError
    from mlsyskit.tools.fl import server_cli as cli
    from mlsyskit.tools.fl.config import ATTACKS

    @app.command()
    def simulate(config: Path | None = cli.JOB_CONFIG, strategy: str | None = cli.STRATEGY,
                 dataset: str | None = cli.DATASET, model: str | None = cli.MODEL,
                 clients: int | None = cli.CLIENTS, per_round: int | None = cli.PER_ROUND,
                 rounds: int | None = cli.ROUNDS, partition: str | None = cli.PARTITION,
                 alpha: float | None = cli.ALPHA, seed: int | None = cli.SEED,
                 malicious_fraction: float = typer.Option(0.0, "--malicious-fraction",
                                                          help="Fraction of clients that attack (0 to <1)."),
                 attack: str = typer.Option("label-flip", "--attack", help="What the attackers do: " +
                                            " | ".join(a for a in ATTACKS if a != "none") + "."),
                 dropout: float = typer.Option(0.0, "--dropout", help="Chance a selected client vanishes mid-round."),
                 scheduler: str | None = typer.Option(None, "--scheduler", help="Who trains each round: random | tifl "
                                                      "| oort | fast | rfair | afair | perf | adaptive (default: the "
                                                      "strategy's own selector; with --strategy tiff the scheduler "
                                                      "picks among the providers TIFF trusts)."),
                 weights: str | None = typer.Option(None, "--weights", help="Free knob weights for fast|rfair|afair|"
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
                 backend: str = typer.Option("inprocess", "--backend", help="Where clients train: inprocess | ray."),
                 ray_address: str | None = typer.Option(None, "--ray-address",
                                                        help="Ray cluster to join with --backend ray."),
                 eval_clients: int = typer.Option(1000, "--eval-clients", help="Per-client accuracy at the end on "
                                                  "every client up to this many, else on a seeded sample of them."),
                 run_dir: Path = cli._run_dir_option("runs/fl-sim"),
                 fresh: bool = cli.FRESH, json_out: bool = json_option(),
                 verbose: bool = verbose_option(), quiet: bool = quiet_option()) -> None:
        """The same server logic with in-process clients on a virtual clock (deterministic for a seed)."""
        set_verbosity(verbose, quiet)
        from mlsyskit.tools.fl.backends import make_backend
        from mlsyskit.tools.fl.coordinator import JobMismatch
        from mlsyskit.tools.fl.report import load_run, summarize
        from mlsyskit.tools.fl.sim_world import WorldConfig
        from mlsyskit.tools.fl.simulator import Simulation, SimulationOptions
        from mlsyskit.tools.fl.threads import single_threaded

        job = cli._job(config, strategy, dataset, clients, per_round, rounds, partition, alpha, seed, model,
                       round_timeout_s=round_timeout)
        try:
            options = SimulationOptions(scheduler, parse_weights(weights), deadline_s=deadline,
                                        world=WorldConfig(availability=availability,
                                                          slowdown_fraction=slowdown_fraction),
                                        eval_clients=eval_clients)
            options.make_scheduler()  # refuse a bad name or weights before any work
        except (KeyError, ValueError) as e:
            raise UsageError(str(e).strip("'\"")) from None
        if deadline is not None and deadline <= 0 or eval_clients < 1:
            raise UsageError("--deadline must be positive and --eval-clients at least 1")
        if attack not in ATTACKS or attack == "none":
            raise UsageError(f"--attack must be one of {', '.join(a for a in ATTACKS if a != 'none')}, "
                             f"got {attack!r}")
        if not 0 <= malicious_fraction < 1 or not 0 <= dropout < 1:
            raise UsageError("--malicious-fraction and --dropout must be in [0, 1)")
        attacks = cli.malicious_clients(job.data.num_clients, malicious_fraction, attack, job.seed)
        single_threaded()
        try:
            trainer = make_backend(backend, ray_address)
        except ValueError as e:
            raise UsageError(str(e)) from None
        store = cli._open_store(run_dir, fresh)
        try:
            with reporter() as rep:
                rep.phase(f"preparing {job.data.num_clients} clients (data, profiles and availability are lazy)")
                simulation = Simulation(job, store, attacks, dropout, trainer, options)
                simulation.run(on_round=cli._round_progress(rep, job.rounds), on_phase=rep.phase)
        except (JobMismatch, ValueError) as e:
            raise UsageError(str(e)) from None
        finally:
            trainer.close()
            store.close()
        cli._print_summary(summarize(load_run(run_dir)), json_out)


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
