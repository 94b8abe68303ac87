"""Scheduling figures of a run, from its stored round records (issue 12's metrics), and their plots.

Pure over the `fl_rounds` records (`RoundOutcome.to_record()`), so a simulation, a real run and the
benchmark compute them the same way. Simulated wall-clock is the sum of round durations (virtual
seconds in a simulation). A client's CPU-seconds are the `cpu_time_s` it reported, valid or failed;
wasted CPU-seconds are those of failed reports (late or gone offline: computed, never aggregated).
Participation counts selections. Jain's indices run over the whole population (never-selected
clients count as 0). Per-client accuracy is that of the kept model on each evaluated client's own
test split (the simulator evaluates every client, or a seeded sample at large scale).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mlsyskit.tools.fl.scheduling import metrics


def round_end_times(records: Sequence[Mapping[str, Any]]) -> list[float]:
    ends, now = [], 0.0
    for record in records:
        now += float(record["duration_s"])
        ends.append(now)
    return ends


def accuracies(records: Sequence[Mapping[str, Any]]) -> list[float]:
    return [float(r["global"]["accuracy"]) for r in records]


def usage(records: Sequence[Mapping[str, Any]]) -> tuple[dict[int, int], dict[int, float], dict[int, float]]:
    """(selections, CPU-seconds, wasted CPU-seconds) per client."""
    picked: dict[int, int] = {}
    cpu: dict[int, float] = {}
    wasted: dict[int, float] = {}
    for record in records:
        for cid in record["selected"]:
            picked[int(cid)] = picked.get(int(cid), 0) + 1
        for key, report in record["reports"].items():
            cid, seconds = int(key), float(report["metrics"].get("cpu_time_s", 0.0))
            cpu[cid] = cpu.get(cid, 0.0) + seconds
            if report["status"] == "failed":
                wasted[cid] = wasted.get(cid, 0.0) + seconds
    return picked, cpu, wasted


def schedule_metrics(records: Sequence[Mapping[str, Any]], population: int,
                     client_accuracy: Mapping[int, float] | None = None, target: float | None = None) -> dict[str, Any]:
    ends, accs = round_end_times(records), accuracies(records)
    picked, cpu, wasted = usage(records)
    durations = [float(r["duration_s"]) for r in records]
    out: dict[str, Any] = {
        "final_accuracy": accs[-1] if accs else None,
        "best_accuracy": max(accs) if accs else None,
        "sim_time_s": ends[-1] if ends else 0.0,
        "mean_round_s": sum(durations) / len(durations) if durations else 0.0,
        "participation_jain": metrics.jain_index(metrics.per_client(population, picked)),
        "cpu_jain": metrics.jain_index(metrics.per_client(population, cpu)),
        "clients_selected": len(picked),
        **metrics.work_totals(cpu, wasted),
    }
    if client_accuracy:
        spread = metrics.accuracy_spread(list(client_accuracy.values()))
        out |= {f"client_accuracy_{k}": v for k, v in spread.items()} | {"clients_evaluated": len(client_accuracy)}
    if target is not None:
        out["target_accuracy"] = target
        out["time_to_target_s"] = metrics.time_to_accuracy(ends, accs, target)
    return out


def plot_schedules(runs: Mapping[str, tuple[Sequence[Mapping[str, Any]], int, Mapping[int, float]]],
                   out_dir: str | Path, prefix: str = "") -> list[Path]:
    """accuracy_time.png (global accuracy vs simulated wall-clock, one line per run) and fairness.png
    (participation and CPU-seconds per client, sorted; per-client accuracy, sorted) for runs given as
    label -> (round records, population, per-client accuracy)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for label, (records, _, _) in runs.items():
        ax.plot(round_end_times(records), accuracies(records), label=label)
    ax.set(xlabel="simulated wall-clock (s)", ylabel="global test accuracy", title="accuracy vs wall-clock")
    if runs:
        ax.legend(fontsize="small")
    time_png = out / f"{prefix}accuracy_time.png"
    fig.savefig(time_png, dpi=100, bbox_inches="tight")
    plt.close(fig)

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for label, (records, population, client_accuracy) in runs.items():
        picked, cpu, _ = usage(records)
        share = [i / max(population - 1, 1) for i in range(population)]
        axes[0].plot(share, sorted(metrics.per_client(population, picked)), label=label)
        axes[1].plot(share, sorted(metrics.per_client(population, cpu)), label=label)
        ordered = sorted(client_accuracy.values())
        axes[2].plot([i / max(len(ordered) - 1, 1) for i in range(len(ordered))], ordered, label=label)
    axes[0].set(xlabel="clients (sorted)", ylabel="times selected", title="participation")
    axes[1].set(xlabel="clients (sorted)", ylabel="CPU-seconds", title="client CPU-seconds")
    axes[2].set(xlabel="evaluated clients (sorted)", ylabel="accuracy of the kept model", title="per-client accuracy")
    if runs:
        axes[2].legend(fontsize="small")
    fairness_png = out / f"{prefix}fairness.png"
    fig.savefig(fairness_png, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return [time_png, fairness_png]


def observe_late(selector: Any, cid: int, received_s: float) -> None:
    """A late answer's round trip, measured on the server's clock, teaches the scheduler's latency tiers what
    the deadline hid (its report said only "at least the deadline"); re-tiering follows at the next round."""
    tiers = getattr(getattr(selector, "scheduler", selector), "tiers", None)
    if tiers is not None:
        tiers.observe(cid, received_s)


def scheduling_record(selector: Any) -> dict[str, Any]:
    """The scheduler's view after a round: tier and latency EMA per profiled client, re-tierings so far.
    Empty for selectors without tiers; a TIFF-gated scheduler is looked into."""
    tracked = getattr(selector, "scheduler", selector)  # GatedScheduler(gate, scheduler)
    tiers = getattr(tracked, "tiers", None)
    if tiers is None:
        return {}
    return {"tier": {str(c): t for c, t in sorted(tiers.tier.items())},
            "latency_ema_s": {str(c): v for c, v in sorted(tiers.ema.items())}, "retiers": tiers.retiers}
