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
                 run_dir: Path = cli._run_dir_option("runs/fl-sim"),
                 fresh: bool = cli.FRESH, json_out: bool = json_option(),
                 verbose: bool = verbose_option(), quiet: bool = quiet_option()) -> None:
        """The same server logic with in-process clients on a virtual clock (deterministic for a seed)."""
        set_verbosity(verbose, quiet)
        from mlsyskit.tools.fl.coordinator import JobMismatch
        from mlsyskit.tools.fl.report import load_run, summarize
        from mlsyskit.tools.fl.simulator import Simulation
        from mlsyskit.tools.fl.threads import single_threaded

        job = cli._job(config, strategy, dataset, clients, per_round, rounds, partition, alpha, seed, model)
        if attack not in ATTACKS or attack == "none":
            raise UsageError(f"--attack must be one of {', '.join(a for a in ATTACKS if a != 'none')}, "
                             f"got {attack!r}")
        if not 0 <= malicious_fraction < 1 or not 0 <= dropout < 1:
            raise UsageError("--malicious-fraction and --dropout must be in [0, 1)")
        attacks = cli.malicious_clients(job.data.num_clients, malicious_fraction, attack, job.seed)
        single_threaded()
        store = cli._open_store(run_dir, fresh)
        try:
            with reporter() as rep:
                rep.phase(f"preparing {job.data.num_clients} clients")
                simulation = Simulation(job, store, attacks, dropout)
                simulation.run(on_round=cli._round_progress(rep, job.rounds))
        except (JobMismatch, ValueError) as e:
            raise UsageError(str(e)) from None
        finally:
            store.close()
        cli._print_summary(summarize(load_run(run_dir)), json_out)
