#!/usr/bin/env python
"""TIFF sweep (simulated): TIFF against the default (random selection, FedAvg, equal pay) and the robust
aggregators (coordinate-wise median, trimmed mean, multi-Krum, FedAvgM, FedAdam: FedAvg's selection and pay
with another rule) in every cell of datasets x Dirichlet alpha x attacker fraction x attack, several seeds,
the same attackers for every strategy.

Targets, per cell, on the means over seeds (and recorded per seed):
- with attackers: tokens per malicious provider <= 0.80x the default's, tokens per honest provider
  >= 1.07x the default's, accuracy of the kept model >= max(default, best robust aggregator) - 1 point;
- without attackers: accuracy >= the default's - 1 point, tokens per honest provider >= 0.95x the default's;
- every run: the ledger sums to zero (|total| <= 1e-9).
Every job keeps its best model by the server's validation split, and "accuracy" is that model's
accuracy on the held-out test split (the last round's model is recorded too).

Datasets: digits, breast-cancer (scikit-learn files), mnist1d (procedural) and `classification`:
scikit-learn's make_classification (10 classes, 40 features, 3000 samples; generated, seeded by the
job seed; `bench_fl_tiff:classification`, a `package.module:loader` dataset).

Tuning: the constants (verification and bound, quality floor, trust fraction, the server optimisers'
rates) were chosen on the digits cells; every other dataset's cells are reported as `held-out` and
were not looked at while tuning. The JSON is rewritten after every cell, so a run cut short keeps what
it measured, and `--resume` skips the cells already in it. Each cell records the load average.

    .venv/bin/python scripts/bench_fl_tiff.py --out runs/bench_fl_tiff.json            # the full sweep
    .venv/bin/python scripts/bench_fl_tiff.py --quick --out runs/bench_quick.json      # CI: seconds
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from mlsyskit.core.console import emit_table, log, make_table
from mlsyskit.core.storage import MetaStore
from mlsyskit.tools.fl.config import DataSpec, JobConfig
from mlsyskit.tools.fl.incentive.ledger import client_account
from mlsyskit.tools.fl.simulator import Simulation, choose_attackers
from mlsyskit.tools.fl.strategy import ROBUST, STRATEGIES

ATTACKS = ("label-flip", "noisy-labels", "random-update", "free-rider", "quality-liar", "sign-flip", "scaled")
CLASSIFICATION = "bench_fl_tiff:classification"  # --datasets classification: the loader below
TUNING_DATASETS = ("digits",)
TUNING = {  # recorded in the JSON: which constants were chosen where
    "tuning_split": "the digits cells (part: tuning); classification, mnist1d and breast-cancer cells are held out "
                    "(part: held-out)",
    "constants": {
        "verify.NORM_RATIO_MIN/MIN_ALIGNMENT": "digits, MLP, Dirichlet 0.5 and 1.0, rounds 1-15, seed 0",
        "verify.CLIP_RATIO = 2, TYPICAL_QUANTILE = 0.25, TYPICAL_CAP = 20": "digits, Dirichlet 0.05, 50% scaled "
                                                                              "attackers and none, seed 0",
        "EconomyConfig.quality_floor = 0.25": "digits",
        "trusted_random.TRUST_FRACTION = 0.5 (also tiff_tokens.PRE_CHANCE_FLOOR)": "digits",
        "tiff.CHANCE_MARGIN = 0.1": "digits",
        "trimmed_mean.TRIM_FRACTION = 0.2, krum f = (n - 3) // 2": "the papers' defaults, not tuned",
        "fedavgm.SERVER_LR = 1, MOMENTUM = 0.9; fedadam.SERVER_LR = 0.01": "digits, Dirichlet 0.5, no attackers, "
                                                                           "seed 0, 20 rounds",
        "fedadam-sf: B1, B2 as fedadam (the paper's), TAU_REL = 1e-3 (the paper's tau, relative)": "not tuned",
        "fedadam-sfcap: the rate capped by the reference update's RMS; TAU_REL_CAPPED = 1e-2": "digits, Dirichlet 0.05 "
            "and 1.0, none and 50% scaled, seeds 0-2 (against a rate from the reference alone and tau 1e-3, 1e-1)",
        "fedadam-sfm (rate from the momentum) and fedadam-sfv (the better of sfcap's and sfm's step on the server's "
        "validation split), no new constant": "digits, the same 4 cells, seeds 0-2: mean kept accuracy 0.855 and "
            "0.882 against sfcap's 0.886, so neither replaced the default"},
    "judged_tiff": "tiff+fedadam-sfcap (TIFF with scale-free FedAdam whose rate is capped by the RMS of the server's "
                   "own reference update, tau 1e-2 x the rate), chosen on digits (Dirichlet 0.05 and 1.0, no attackers "
                   "and 50% scaled, seeds 0-2; mean kept accuracy 0.832/0.931/0.838/0.942 against tiff+fedadam-sf "
                   "0.823/0.931/0.823/0.924, the same cap with tau 1e-3 0.836/0.931/0.834/0.933 and 1e-1 "
                   "0.795/0.927/0.812/0.929, and a rate from the reference alone 0.806/0.929/0.808/0.931) before any "
                   "held-out cell was run with it. Earlier judged variants, chosen on digits the same way: tiff+fedadam, "
                   "then tiff+fedadam-sf",
    "rules_without_constants": ["earned pot, also before the model beats chance (incentive/earned_pot.py)",
                                "selection in FedAvg's random order (selection/trusted_random.py)"]}
MALICIOUS_MAX, HONEST_MIN, ACCURACY_SLACK = 0.80, 1.07, 1.0  # x default, x default, points below the best peer
HONEST_MIN_CLEAN = 0.95  # x default, honest pay without attackers


def classification(num_clients: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's make_classification: 3000 samples, 10 classes of 2 clusters, 40 features (15 informative,
    5 redundant), class separation 2 (an MLP trained on all of it centrally: ~0.90 test accuracy)."""
    from sklearn.datasets import make_classification

    x, y = make_classification(n_samples=3000, n_features=40, n_informative=15, n_redundant=5, n_classes=10,
                               n_clusters_per_class=2, class_sep=2.0, random_state=seed)
    return x.astype(np.float32), y.astype(np.int64)


sys.modules.setdefault("bench_fl_tiff", sys.modules[__name__])  # so CLASSIFICATION resolves when run as a script


def one_run(strategy: str, seed: int, dataset: str, alpha: float, fraction: float, attack: str, args) -> dict:
    config = JobConfig(strategy=strategy, rounds=args.rounds, per_round=args.per_round, seed=seed,
                       data=DataSpec(dataset=CLASSIFICATION if dataset == "classification" else dataset,
                                     num_clients=args.clients, partition="dirichlet",
                                     alpha=alpha, seed=seed))
    attacks = choose_attackers(args.clients, fraction, attack, seed) if fraction > 0 else {}
    started = time.perf_counter()
    with MetaStore(":memory:") as store:
        sim = Simulation(config, store, attacks)
        result = sim.run()
        ledger = sim.coordinator.ledger
        pay = ledger.totals_by("pay")
        honest = [c for c in range(args.clients) if c not in attacks]
        last = result.outcomes[-1].global_metrics
        return {
            "accuracy": last["kept_accuracy"], "last_accuracy": last["accuracy"], "kept_round": last["kept_round"],
            "tokens_per_honest": statistics.fmean(pay.get(client_account(c), 0.0) for c in honest),
            "tokens_per_malicious": statistics.fmean(pay.get(client_account(c), 0.0) for c in attacks)
            if attacks else None,
            "malicious_selected": sum(len(set(o.selected) & set(attacks)) for o in result.outcomes),
            "malicious_aggregated": sum(r.aggregated for o in result.outcomes for r in o.reports.values()
                                        if r.client_id in attacks),
            "honest_rejected": sum(r.status == "rejected" for o in result.outcomes for r in o.reports.values()
                                   if r.client_id not in attacks),
            "honest_aggregated": sum(r.aggregated for o in result.outcomes for r in o.reports.values()
                                     if r.client_id not in attacks),
            "ledger_total": ledger.total(), "wall_s": time.perf_counter() - started}


def judge(runs: dict[int, dict[str, dict]], with_attackers: bool, tiff: str = "tiff",
          robust: tuple[str, ...] = ()) -> dict:
    """Targets of one cell: measured on the means over seeds, and which seeds meet each on their own. The
    accuracy bar with attackers is the best of the default and the robust aggregators (each by its mean)."""
    strategies = ("fedavg", tiff, *robust)

    def ratio(pair: dict, key: str) -> float | None:  # pair: one seed's runs, or the means
        base = pair["fedavg"][key]
        return pair[tiff][key] / base if base else None

    def accuracy_gap(r: dict) -> float:
        peers = ("fedavg", *robust) if with_attackers else ("fedavg",)
        return 100 * (r[tiff]["accuracy"] - max(r[p]["accuracy"] for p in peers))

    checks = {"accuracy": (accuracy_gap, lambda v: v >= -ACCURACY_SLACK,
                           f">= -{ACCURACY_SLACK:g} points vs " + ("max(default, robust)" if with_attackers and robust
                                                                  else "default"))}
    if with_attackers:
        checks["malicious_tokens"] = (lambda r: ratio(r, "tokens_per_malicious"),
                                      lambda v: v is not None and v <= MALICIOUS_MAX, f"<= {MALICIOUS_MAX}x")
        checks["honest_tokens"] = (lambda r: ratio(r, "tokens_per_honest"),
                                   lambda v: v is not None and v >= HONEST_MIN, f">= {HONEST_MIN}x")
    else:
        checks["honest_tokens"] = (lambda r: ratio(r, "tokens_per_honest"),
                                   lambda v: v is not None and v >= HONEST_MIN_CLEAN, f">= {HONEST_MIN_CLEAN}x")
    keys = ("accuracy", "tokens_per_honest", *(("tokens_per_malicious",) if with_attackers else ()))
    means = {s: {k: statistics.fmean(r[s][k] for r in runs.values()) for k in keys} for s in strategies}
    targets = {}
    for name, (measure, ok, text) in checks.items():
        value = measure(means)
        if value is None:  # the default paid this group nothing: no ratio to speak of
            targets[name] = {"measured": None, "target": text, "met": None, "seeds_met": [],
                             "note": "n/a: the default paid this group nothing"}
            continue
        targets[name] = {"measured": value, "target": text, "met": bool(ok(value)),
                         "seeds_met": sorted(seed for seed, r in runs.items() if ok(measure(r)))}
    conserved = max(abs(r[s]["ledger_total"]) for r in runs.values() for s in r)
    targets["ledger_conserved"] = {"measured": conserved, "target": "<= 1e-9", "met": conserved <= 1e-9,
                                   "seeds_met": sorted(runs)}
    best = max(("fedavg", *robust), key=lambda s: means[s]["accuracy"])
    return {"means": means, "best_peer": best, "targets": targets}


def run_cell(task) -> tuple[str, dict | None]:
    """One cell: every seed, both strategies, judged. None when the budget ran out before it started."""
    dataset, alpha, fraction, attack, args, deadline = task
    key = cell_key(dataset, alpha, fraction, attack)
    if deadline is not None and time.time() > deadline:
        return key, None
    robust = tuple(args.robust) if fraction > 0 else ()  # without attackers only the default is the bar
    also = tuple(s for s in args.also if s not in ("fedavg", args.tiff, *robust))
    earlier = args.peer_cells.get(key, {}).get("runs", {})  # --peers-from: the peers' runs of an earlier sweep
    reused: dict[str, list[str]] = {}

    def run(s: str, seed: int) -> dict:
        if s != args.tiff and s in earlier.get(str(seed), {}):
            reused.setdefault(s, []).append(args.peer_cells[key]["from"])
            return earlier[str(seed)][s]
        return one_run(s, seed, dataset, alpha, fraction, attack, args)

    runs = {seed: {s: run(s, seed) for s in ("fedavg", args.tiff, *robust, *also)} for seed in _seeds(args)}
    return key, judge(runs, fraction > 0, args.tiff, robust) | {
        "dataset": dataset, "alpha": alpha, "attackers": fraction, "attack": attack,
        "part": "tuning" if dataset in TUNING_DATASETS else "held-out", "seeds": _seeds(args),
        "loadavg": list(os.getloadavg()), "runs": {str(seed): r for seed, r in runs.items()},
        "reused_runs": {s: sorted(set(f)) for s, f in reused.items()}}


def _run_all(tasks: list, workers: int):
    """Cells as they finish. With workers > 1 they run in forked processes, each (dataset, alpha) group of
    cells in one process and in order: the cells of a group share the data and the consumers' local-only
    baselines of each seed (cached per process), which are most of a MNIST-1D run's cost. A cell is
    deterministic per seed, so where it runs changes nothing but the wall time."""
    if workers <= 1:
        yield from map(run_cell, tasks)
        return
    groups: dict[tuple, list] = {}
    for task in tasks:
        groups.setdefault(task[:2], []).append(task)
    datasets = list(dict.fromkeys(dataset for dataset, *_ in tasks))
    # the datasets in the order given, so the costliest given first start first and the sweep ends sooner
    ordered = sorted(groups.values(), key=lambda g: datasets.index(g[0][0]))
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        for chunk in pool.imap_unordered(_run_group, ordered):
            yield from chunk


def _run_group(tasks: list) -> list:
    return [run_cell(t) for t in tasks]


def _seeds(args) -> list[int]:
    return list(range(args.seed_start, args.seed_start + args.seeds))


def cells(args) -> list[tuple[str, float, float, str]]:
    """Attack by attack in the order given (the cells without attackers first), then fraction, alpha and
    dataset, so a run cut short by --budget-s misses whole attacks at the end of the list and still spans
    every dataset and alpha of the attacks it ran."""
    out = []
    for attack in ("none", *args.attacks):
        for fraction in args.fractions:
            if (fraction == 0) != (attack == "none"):
                continue
            for alpha in args.alphas:
                for dataset in args.datasets:
                    out.append((dataset, alpha, fraction, attack))
    return out


def cell_key(dataset: str, alpha: float, fraction: float, attack: str) -> str:
    return f"{dataset}/alpha={alpha:g}/attackers={fraction:g}/{attack}"


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--datasets", nargs="+", default=["digits", "classification", "mnist1d"],
                   choices=["digits", "classification", "mnist1d", "breast-cancer"])
    p.add_argument("--alphas", type=float, nargs="+", default=[0.05, 1.0])
    p.add_argument("--fractions", type=float, nargs="+", default=[0.0, 0.5])
    p.add_argument("--attacks", nargs="+", default=["scaled", "sign-flip", "label-flip"], choices=ATTACKS)
    p.add_argument("--tiff", default="tiff", choices=[n for n in STRATEGIES.names() if n.startswith("tiff")],
                   help="the TIFF strategy judged: tiff (FedAvg of the admitted updates) or tiff+<rule>")
    p.add_argument("--also", nargs="*", default=[], choices=STRATEGIES.names(),
                   help="strategies also run and recorded in every cell, not judged (e.g. the other TIFF variants)")
    p.add_argument("--robust", nargs="*", default=[s.name for s in ROBUST], choices=[s.name for s in ROBUST],
                   help="robust aggregators run beside it in every cell (the accuracy bar with attackers)")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--seed-start", type=int, default=0, help="the seeds are seed-start .. seed-start + seeds - 1")
    p.add_argument("--clients", type=int, default=20)
    p.add_argument("--per-round", type=int, default=5)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--quick", action="store_true", help="CI: digits, alpha 0.5, 0 and 0.4 attackers, 2 attacks, "
                   "the median beside, 1 seed, 10 clients, 6 rounds")
    p.add_argument("--resume", action="store_true", help="keep the cells already in --out")
    p.add_argument("--budget-s", type=float, default=0.0, help="start no new cell after this many seconds (0: none); "
                   "the cells not run are listed in the JSON")
    p.add_argument("--merge", type=Path, nargs="*", default=[], help="also keep the cells of these JSONs (the same "
                   "sweep run on some of the datasets by another process)")
    p.add_argument("--peers-from", type=Path, nargs="*", default=[], help="reuse the runs of every strategy but "
                   "--tiff from these earlier sweeps' JSONs where they have the cell and seed (a run is deterministic per "
                   "seed; the cell records which runs were reused and from where; check that the code they ran on gives "
                   "the same peers before relying on it)")
    p.add_argument("--workers", type=int, default=1, help="cells run in this many processes at once")
    p.add_argument("--out", type=Path, default=Path("runs/bench_fl_tiff.json"))
    args = p.parse_args(argv)
    args.peer_cells = {}
    for path in args.peers_from:
        for key, cell in json.loads(path.read_text())["cells"].items():
            args.peer_cells.setdefault(key, cell | {"from": str(path)})
    if args.quick:
        args.datasets, args.alphas, args.fractions = ["digits"], [0.5], [0.0, 0.4]
        args.attacks, args.seeds, args.clients, args.per_round, args.rounds = ["label-flip", "scaled"], 1, 10, 4, 6
        args.robust = ["median"]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    setting = {k: v for k, v in vars(args).items()
               if k not in ("out", "resume", "budget_s", "workers", "merge", "peer_cells", "peers_from")} | {
        "tuning_datasets": list(TUNING_DATASETS)}
    result_extra = {"peers_from": [str(path) for path in args.peers_from]} if args.peers_from else {}
    done: dict = {}
    if args.resume and args.out.is_file():
        previous = json.loads(args.out.read_text())
        if previous.get("setting") == setting:
            done = previous["cells"]
    for other in args.merge:  # cells of a run of the same sweep on other datasets (another process)
        previous = json.loads(other.read_text())
        if {k: v for k, v in previous["setting"].items() if k != "datasets"} != \
                {k: v for k, v in setting.items() if k != "datasets"}:
            raise SystemExit(f"error: {other} is a different sweep (its setting differs beyond the datasets)")
        done |= {k: c for k, c in previous["cells"].items() if k not in done and c["dataset"] in args.datasets}
    result = {"setting": setting, "tuning": TUNING, **result_extra, "cells": done}
    todo = cells(args)
    result["not_run"] = []
    deadline = time.time() + args.budget_s if args.budget_s else None
    tasks = [(dataset, alpha, fraction, attack, args, deadline) for dataset, alpha, fraction, attack in todo
             if cell_key(dataset, alpha, fraction, attack) not in done]
    for i, (key, cell) in enumerate(_run_all(tasks, args.workers), len(todo) - len(tasks) + 1):
        if cell is None:
            result["not_run"].append(key)
            continue
        result["cells"][key] = cell
        _write(args.out, result)
        log(f"[{i}/{len(todo)}] {key}: " + " ".join(f"{n}={_short(t['measured'])}({_met(t)})"
                                                    for n, t in cell["targets"].items() if n != "ledger_conserved"))
    result["cells"] = {cell_key(*c): result["cells"][cell_key(*c)] for c in todo if cell_key(*c) in result["cells"]}
    result["summary"] = summary(result["cells"])
    _write(args.out, result)
    emit_table(make_table(f"{args.tiff} vs default and robust aggregators, mean of {args.seeds} seeds per cell "
                          f"(accuracy: kept model, test split; seeds {_seeds(args)})",
                          ["cell", "part", "acc default", "best peer", "acc peer", "acc tiff", "d points", "honest x",
                           "malicious x", "targets met", "seeds meeting all", "load"],
                          [_row(k, c) for k, c in result["cells"].items()]))
    emit_table(make_table("cells meeting each target", ["dataset", "part", "target", "met", "missed", "n/a",
                                                           "min", "mean", "max"],
                          [(dataset, per["part"], name, e["met"], e["missed"], e["n/a"],
                            *(_short(e.get(k)) for k in ("min", "mean", "max")))
                           for dataset, per in result["summary"].items() for name, e in per["targets"].items()]))
    if result["not_run"]:
        log(f"{len(result['not_run'])} of {len(todo)} cells not run (--budget-s {args.budget_s:g}); listed in the JSON")
    log(f"wrote {args.out}")
    return 0 if all(t["met"] is not False for c in result["cells"].values() for t in c["targets"].values()) else 1


def summary(all_cells: dict) -> dict:
    """Per dataset (with its part, tuning or held-out) and target: cells met, missed and n/a, and the range
    and mean of what was measured (ratios for tokens, points for accuracy)."""
    out: dict[str, dict] = {}
    for cell in all_cells.values():
        per = out.setdefault(cell["dataset"], {"part": cell["part"], "targets": {}})["targets"]
        for name, t in cell["targets"].items():
            entry = per.setdefault(name, {"met": 0, "missed": 0, "n/a": 0, "measured": []})
            entry["met" if t["met"] is True else "missed" if t["met"] is False else "n/a"] += 1
            if t["measured"] is not None:
                entry["measured"].append(t["measured"])
    for per in out.values():
        for entry in per["targets"].values():
            values = entry.pop("measured")
            entry |= {"min": min(values), "mean": statistics.fmean(values), "max": max(values)} if values else {}
    return out


def _row(key: str, cell: dict) -> tuple:
    t, m = cell["targets"], cell["means"]
    evaluated = [x for x in t.values() if x["met"] is not None]
    every = set(cell["seeds"])
    for x in evaluated:
        every &= set(x["seeds_met"])
    tiff = next(s for s in m if s.startswith("tiff"))
    best = cell.get("best_peer", "fedavg")
    return (key, cell["part"], m["fedavg"]["accuracy"], best, m[best]["accuracy"], m[tiff]["accuracy"],
            t["accuracy"]["measured"], _short(t.get("honest_tokens", {}).get("measured")),
            _short(t.get("malicious_tokens", {}).get("measured")),
            f"{sum(x['met'] for x in evaluated)}/{len(evaluated)}", ",".join(map(str, sorted(every))) or "-",
            _short(cell.get("loadavg", [None])[0]))


def _write(path: Path, result: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1, allow_nan=False))
    tmp.replace(path)


def _met(target: dict) -> str:
    return "n/a" if target["met"] is None else "met" if target["met"] else "MISSED"


def _short(value) -> str:
    return "n/a" if value is None else f"{value:.3g}" if isinstance(value, float) else str(value)


if __name__ == "__main__":
    sys.exit(main())
