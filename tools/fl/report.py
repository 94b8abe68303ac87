"""`fl-server report`: what a finished run (real or simulated) paid whom, and how good the model got.

Provider tokens are the `pay` transfers a client received. Honest versus malicious is ground
truth only in a simulation (the simulator records whom it made attack); in a real run it is what
each client declared at registration, which nobody can check, and the summary says which
(`attackers`: "simulation ground truth" or "declared by clients"). The server never uses either.
With a baseline run (the default strategy: random selection, equal pay) the per-provider means
are also given as ratios to the baseline's; a baseline of a different job (data, training,
rounds, clients per round, seed) is refused, or compared with a warning when forced.
Accuracy: the last round's model and the kept one (best on the server's validation split), both
on the test split. Scheduling figures (wall-clock, participation and CPU fairness, wasted work,
per-client accuracy spread; sched_report.py) and their plots come with every run.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlsyskit.core.storage import MetaStore
from mlsyskit.tools.fl.incentive.ledger import Ledger, account_client
from mlsyskit.tools.fl.sched_report import plot_schedules, schedule_metrics

DB_NAME = "fl.db"
SIMULATION_KEY = "simulation"  # (ns "fl") written by the simulator: {"attacks": {client id: attack}, "scheduler"}
CLIENT_ACCURACY_KEY = "client_accuracy"  # (ns "fl") the kept model's accuracy per evaluated client (simulator)
SAME_JOB_KEYS = ("seed", "rounds", "per_round", "data", "train")  # what a baseline must share with the run


class BaselineMismatch(ValueError):
    """The baseline ran a different job, so ratios against it would mean nothing."""


@dataclass
class RunData:
    path: Path
    config: dict[str, Any]
    rounds: list[dict[str, Any]]
    clients: dict[int, dict[str, Any]]
    pay: dict[int, float]
    balances: dict[str, float]
    ledger_total: float
    reimbursements: list[dict[str, Any]]
    pay_rows: list[tuple[int, int, float]]  # (round, client, amount) of every provider payment
    simulated_attacks: dict[int, str] | None = None  # ground truth, only for simulations
    scheduler: str = ""  # the simulation's --scheduler ("" : the strategy's own selector, or a real run)
    client_accuracy: dict[int, float] | None = None  # the kept model per evaluated client (simulations)

    @property
    def population(self) -> int:
        return int(self.config.get("data", {}).get("num_clients", len(self.clients)))

    @property
    def label(self) -> str:
        return self.scheduler or str(self.config.get("strategy", "run"))

    @property
    def attackers_source(self) -> str:
        return "simulation ground truth" if self.simulated_attacks is not None else "declared by clients"

    @property
    def malicious(self) -> list[int]:
        if self.simulated_attacks is not None:
            return sorted(c for c, attack in self.simulated_attacks.items() if attack != "none")
        return sorted(c for c, info in self.clients.items() if info.get("declared_attack", "none") != "none")

    @property
    def honest(self) -> list[int]:
        return sorted(c for c in self.clients if c not in self.malicious)

    def accuracy_curve(self) -> list[float]:
        return [r["global"]["accuracy"] for r in self.rounds]


def load_run(run_dir: str | Path) -> RunData:
    path = Path(run_dir)
    db = path / DB_NAME if path.is_dir() else path
    if not db.is_file():
        raise FileNotFoundError(f"{run_dir} holds no FL run ({DB_NAME} not found)")
    with MetaStore(db) as store:
        ledger = Ledger(store)
        pay = {account_client(a): v for a, v in ledger.totals_by("pay").items() if account_client(a) is not None}
        return RunData(path, store.get("fl", "config", {}), [r for _, r in store.read_log("fl_rounds")],
                       {int(k): v for k, v in store.items("fl_clients")}, pay, ledger.balances(), ledger.total(),
                       [r for _, r in store.read_log("fl_reimbursements")],
                       [(rnd, account_client(payee), amount) for _, rnd, _, payee, amount, kind in ledger.rows()
                        if kind == "pay"], _simulated(store.get("fl", SIMULATION_KEY, None)),
                       str((store.get("fl", SIMULATION_KEY, None) or {}).get("scheduler", "")),
                       {int(k): float(v) for k, v in store.get("fl", CLIENT_ACCURACY_KEY, {}).items()} or None)


def _simulated(record: dict | None) -> dict[int, str] | None:
    return None if record is None else {int(k): str(v) for k, v in record.get("attacks", {}).items()}


def check_same_job(run: RunData, baseline: RunData, force: bool = False) -> list[str]:
    """The job settings in which the two runs differ; raises BaselineMismatch unless `force`."""
    differ = [key for key in SAME_JOB_KEYS if run.config.get(key) != baseline.config.get(key)]
    if differ and not force:
        raise BaselineMismatch(f"baseline {baseline.path} ran a different job ({', '.join(differ)} differ from "
                               f"{run.path}); compare runs of the same job, or pass --force to compare anyway")
    return [f"baseline differs in {key}: {baseline.config.get(key)!r} vs {run.config.get(key)!r}" for key in differ]


def _mean(values: list[float]) -> float | None:
    """None for an empty group (no malicious providers, say): JSON has no NaN."""
    return sum(values) / len(values) if values else None


def summarize(run: RunData, baseline: RunData | None = None, force: bool = False) -> dict[str, Any]:
    """Raises BaselineMismatch for a baseline of another job unless `force` (then the summary warns)."""
    warnings = check_same_job(run, baseline, force) if baseline is not None else []
    honest = _mean([run.pay.get(c, 0.0) for c in run.honest])
    malicious = _mean([run.pay.get(c, 0.0) for c in run.malicious])
    curve = run.accuracy_curve()
    last = run.rounds[-1]["global"] if run.rounds else {}
    out: dict[str, Any] = {
        "run": str(run.path), "strategy": run.config.get("strategy"), "rounds": len(run.rounds),
        # final = the last round's model; best = the kept model (best on the server's validation split, not on
        # the test split it is reported on); runs from before the kept model existed fall back to the last
        "final_accuracy": curve[-1] if curve else None,
        "best_accuracy": last.get("kept_accuracy", curve[-1] if curve else None),
        "best_round": last.get("kept_round", len(curve) if curve else None),
        "attackers": run.attackers_source,
        "honest_providers": len(run.honest), "malicious_providers": len(run.malicious),
        "tokens_per_honest_provider": honest, "tokens_per_malicious_provider": malicious,
        "ledger_total": run.ledger_total, "pool": run.balances.get("pool", 0.0),
        "infra": run.balances.get("infra", 0.0)}
    if run.reimbursements:
        consumers = run.reimbursements[-1]["consumers"]
        out["consumers"] = {cid: {k: c[k] for k in ("paid", "refund", "trr", "uir")} for cid, c in consumers.items()}
        out["mean_trr"] = _mean([c["trr"] for c in consumers.values()])
    out["scheduling"] = schedule_metrics(run.rounds, run.population, run.client_accuracy) | {
        "scheduler": run.label}
    if warnings:
        out["warnings"] = warnings
    if baseline is not None:
        base = summarize(baseline)
        out["baseline"] = {k: base[k] for k in ("run", "strategy", "final_accuracy", "tokens_per_honest_provider",
                                               "tokens_per_malicious_provider")}
        out["honest_tokens_vs_baseline"] = _ratio(honest, base["tokens_per_honest_provider"])
        out["malicious_tokens_vs_baseline"] = _ratio(malicious, base["tokens_per_malicious_provider"])
        if out["final_accuracy"] is not None and base["final_accuracy"] is not None:
            out["accuracy_gain_points"] = 100.0 * (out["final_accuracy"] - base["final_accuracy"])
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def plot(run: RunData, out_dir: str | Path, baseline: RunData | None = None) -> list[Path]:
    """Accuracy per round and cumulative provider tokens (honest vs malicious) as PNGs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    runs = [(run.config.get("strategy", "run"), run)] + ([("baseline", baseline)] if baseline else [])
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, r in runs:
        ax.plot(range(1, len(r.rounds) + 1), r.accuracy_curve(), label=label)
    ax.set(xlabel="round", ylabel="global test accuracy", title="accuracy")
    if any(r.rounds for _, r in runs):
        ax.legend()
    accuracy_png = out / "accuracy.png"
    fig.savefig(accuracy_png, dpi=100, bbox_inches="tight")
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4))
    for label, r in runs:
        for group, members, style in (("honest", set(r.honest), "-"), ("malicious", set(r.malicious), "--")):
            if not members:
                continue
            per_round = [0.0] * (len(r.rounds) + 1)
            for rnd, cid, amount in r.pay_rows:
                if cid in members and 0 < rnd <= len(r.rounds):
                    per_round[rnd] += amount / len(members)
            curve = [sum(per_round[1:i + 1]) for i in range(1, len(per_round))]
            ax.plot(range(1, len(curve) + 1), curve, style, label=f"{label} {group}")
    ax.set(xlabel="round", ylabel="tokens earned per provider (cumulative)", title="provider tokens")
    if ax.get_legend_handles_labels()[0]:  # a run that never finished a round has no curves
        ax.legend()
    tokens_png = out / "tokens.png"
    fig.savefig(tokens_png, dpi=100, bbox_inches="tight")
    plt.close(fig)
    labelled = {f"{r.label} ({name})": (r.rounds, r.population, r.client_accuracy or {}) for name, r in runs}
    return [accuracy_png, tokens_png, *plot_schedules(labelled, out)]
