"""What fl-server's commands share: their options, the job they describe, the run directory, the summary.

server_cli.py (run, partition, report, certs) and simulate_cli.py (simulate) both import this
module and not each other.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from mlsyskit.core.cli import load_command_config, seed_option
from mlsyskit.core.console import debug, emit_json, emit_table, log, make_table
from mlsyskit.core.errors import UsageError
from mlsyskit.core.storage import MetaStore, StorageError
from mlsyskit.tools.fl.config import DATASETS, PARTITIONS, JobConfig
from mlsyskit.tools.fl.outcome import RoundOutcome
from mlsyskit.tools.fl.plugins import UserCodeError
from mlsyskit.tools.fl.report import DB_NAME
from mlsyskit.tools.fl.selectors import SELECTORS
from mlsyskit.tools.fl.strategy import DEFAULT_STRATEGY, STRATEGIES

STRATEGY = typer.Option(None, "--strategy", help=f"{' | '.join(STRATEGIES.names())} (default {DEFAULT_STRATEGY}: chosen on the tuning sweep, see docs/tiff.md).")
DATASET = typer.Option(None, "--dataset", help=f"{' | '.join(DATASETS)} or package.module:loader, a function "
                       "(num_clients, seed) -> (x, y) or (x, y, client_of) (default digits).")
SCHEDULER = typer.Option(None, "--scheduler", help=f"Who trains each round and its deadline: {' | '.join(SELECTORS)} "
                         "(docs/fl-scheduling.md); with --strategy tiff it picks among the providers TIFF trusts. "
                         "Default: the strategy's own selection.")
MODEL = typer.Option(None, "--model", help="package.module:factory, a function (num_features, num_classes) -> "
                     "torch nn.Module, trained by every client (default: the built-in MLP). Weights travel as raw "
                     "buffers; a client whose model shapes differ is refused at registration.")
CLIENTS = typer.Option(None, "--clients", help="Number of clients (ids 0..N-1).")
PER_ROUND = typer.Option(None, "--per-round", help="Clients selected per round.")
ROUNDS = typer.Option(None, "--rounds", help="Rounds to run.")
PARTITION = typer.Option(None, "--partition", help=f"{' | '.join(PARTITIONS)} (digits, mnist1d; synthetic "
                         "clients each draw their own LEAF distribution, so it ignores this).")
ALPHA = typer.Option(None, "--alpha", help="Dirichlet concentration (smaller = more label skew); LEAF's "
                     "synthetic(alpha, beta) are data.synthetic_alpha/_beta in --config.")
SEED = seed_option(None, "Master seed (data, model, selection; default 0).")
FRESH = typer.Option(False, "--fresh", help="Discard an existing run in --run-dir instead of resuming it.")
JOB_CONFIG = typer.Option(None, "--config", dir_okay=False,
                          help="TOML job file: any JobConfig field, e.g. rounds = 20 and [economy] "
                               "quality_exponent = 1.5; flags given here override it.")


def run_dir_option(default: str) -> Any:
    return typer.Option(Path(default), "--run-dir", file_okay=False,
                        help="Checkpoints, ledger and events.jsonl; an existing run resumes.")


def make_job(config: Path | None, strategy, dataset, clients, per_round, rounds, partition, alpha, seed, model=None,
             **extra) -> JobConfig:
    overrides = {"strategy": strategy, "rounds": rounds, "per_round": per_round, "seed": seed, "train.model": model,
                 "data.dataset": dataset, "data.num_clients": clients, "data.partition": partition,
                 "data.alpha": alpha, "data.seed": seed, **extra}
    job = load_command_config(JobConfig, config, overrides)
    if job.strategy not in STRATEGIES.names():
        raise UsageError(f"--strategy must be one of {', '.join(STRATEGIES.names())}, got {job.strategy!r}")
    if job.scheduler and job.scheduler not in SELECTORS:
        raise UsageError(f"--scheduler must be one of {', '.join(SELECTORS.names())}, got {job.scheduler!r}")
    return job


def open_store(run_dir: Path, fresh: bool = False) -> MetaStore:
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        if fresh:
            for path in run_dir.glob(f"{DB_NAME}*"):
                path.unlink()
            (run_dir / "events.jsonl").unlink(missing_ok=True)
        return MetaStore(run_dir / DB_NAME)
    except (OSError, StorageError) as e:
        raise UsageError(f"cannot use run directory {run_dir}: {e}") from None


def round_progress(rep, total: int):
    rep.start("round", total=total)

    def on_round(outcome: RoundOutcome) -> None:
        counts = {s: len(outcome.with_status(s)) for s in ("valid", "rejected", "failed")}
        note = (f"acc {outcome.global_metrics['accuracy']:.3f}  ok {counts['valid']} rej {counts['rejected']} "
                f"fail {counts['failed']}")
        rep.update(completed=outcome.round, note=note)
        debug(f"round {outcome.round}/{total}: {note}, selected {outcome.selected}, {outcome.duration_s:.2f}s")

    return on_round


def user_code_failed(error: UserCodeError) -> UserCodeError:
    """Show the traceback of failing user code with -v, then let the one line end the command (exit 1)."""
    if error.details:
        debug(error.details.rstrip())
    return error


def print_summary(summary: dict, json_out: bool, consumers: bool = False) -> None:
    if json_out:
        emit_json(summary)
        return
    keys = ["strategy", "rounds", "final_accuracy", "best_accuracy", "best_round", "attackers", "honest_providers",
            "malicious_providers",
            "tokens_per_honest_provider", "tokens_per_malicious_provider", "honest_tokens_vs_baseline",
            "malicious_tokens_vs_baseline", "accuracy_gain_points", "mean_trr", "pool", "infra", "ledger_total"]
    shown = dict(summary)
    if abs(shown.get("ledger_total") or 0.0) < 1e-9:   # float sums of the transfers leave ~1e-16: show 0
        shown["ledger_total"] = 0.0
    emit_table(make_table("FL run", ["metric", "value"], [(k, shown[k]) for k in keys if k in shown]))
    if consumers and "consumers" in summary:
        rows = [(cid, c["paid"], c["refund"], c["trr"], c["uir"] if c["uir"] is not None else "-")
                for cid, c in sorted(summary["consumers"].items(), key=lambda kv: int(kv[0]))]
        emit_table(make_table("consumers", ["client", "paid", "refund", "TRR", "UIR"], rows))
    if "plots" in summary:
        log(f"plots: {', '.join(summary['plots'])}")
