"""scripts/bench_fl_tiff.py: the sweep's cells, its per-cell targets (met, missed or n/a, with the seeds
that meet each) and its JSON; the --quick mode runs end to end as CI runs it."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import load_script

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_fl_tiff.py"


def load_bench():
    return load_script(SCRIPT, "bench_fl_tiff")  # worker processes find run_cell by its module's name


def run(accuracy: float, honest: float, malicious: float | None) -> dict:
    return {"accuracy": accuracy, "tokens_per_honest": honest, "tokens_per_malicious": malicious,
            "ledger_total": 0.0}


def test_cells_cover_the_sweep_and_cells_without_attackers_appear_once():
    bench = load_bench()
    args = bench.parse([])
    cells = bench.cells(args)
    assert len(cells) == 3 * 2 * (1 + 1 * 3)  # datasets x alphas x (no attackers + 1 fraction x 3 attacks)
    assert sum(attack == "none" for *_, attack in cells) == 6
    assert {d for d, *_ in cells} == {"digits", "classification", "mnist1d"} and args.seeds >= 3
    assert [d for d, *_ in cells[:3]] == ["digits", "classification", "mnist1d"]  # datasets innermost
    # the setting is in the default sweep: Dirichlet 0.05, half the clients scaling their updates
    assert ("classification", 0.05, 0.5, "scaled") in cells
    assert args.robust == ["median", "trimmed-mean", "krum", "fedavgm", "fedadam"] and args.tiff == "tiff"
    assert bench._seeds(args) == [0, 1, 2] and bench._seeds(bench.parse(["--seeds", "2", "--seed-start", "1"])) == [1, 2]


def test_targets_are_judged_on_means_and_recorded_per_seed():
    bench = load_bench()
    runs = {0: {"fedavg": run(0.80, 10.0, 5.0), "tiff": run(0.85, 12.0, 0.5)},
            1: {"fedavg": run(0.80, 10.0, 5.0), "tiff": run(0.78, 10.5, 4.5)}}  # seed 1 misses all three
    cell = bench.judge(runs, with_attackers=True)
    t = cell["targets"]
    assert t["malicious_tokens"]["measured"] == 0.5 and t["malicious_tokens"]["met"] is True
    assert t["malicious_tokens"]["seeds_met"] == [0]
    assert abs(t["honest_tokens"]["measured"] - 1.125) < 1e-12 and t["honest_tokens"]["seeds_met"] == [0]
    assert abs(t["accuracy"]["measured"] - 1.5) < 1e-9 and t["accuracy"]["seeds_met"] == [0]
    assert t["ledger_conserved"]["met"] is True
    runs[0]["tiff"] = run(0.70, 9.0, 6.0)  # now the means miss every target
    missed = bench.judge(runs, with_attackers=True)["targets"]
    assert [missed[k]["met"] for k in ("accuracy", "malicious_tokens", "honest_tokens")] == [False, False, False]
    runs[0]["fedavg"]["ledger_total"] = 1e-6
    assert bench.judge(runs, with_attackers=True)["targets"]["ledger_conserved"]["met"] is False


def test_without_attackers_only_accuracy_is_judged_and_unpaid_groups_are_na():
    bench = load_bench()
    runs = {0: {"fedavg": run(0.90, 10.0, None), "tiff": run(0.895, 9.0, None)}}
    targets = bench.judge(runs, with_attackers=False)["targets"]
    assert set(targets) == {"accuracy", "honest_tokens", "ledger_conserved"} and targets["accuracy"]["met"] is True
    assert targets["honest_tokens"]["met"] is False and targets["honest_tokens"]["measured"] == 0.9  # < 0.95x
    unpaid = {0: {"fedavg": run(0.9, 10.0, 0.0), "tiff": run(0.9, 11.0, 0.0)}}
    na = bench.judge(unpaid, with_attackers=True)["targets"]["malicious_tokens"]
    assert na["met"] is None and na["measured"] is None and "n/a" in na["note"]


def test_with_attackers_the_accuracy_bar_is_the_best_of_the_default_and_the_robust_aggregators():
    bench = load_bench()
    runs = {0: {"fedavg": run(0.50, 10.0, 5.0), "tiff": run(0.70, 12.0, 0.5), "median": run(0.705, 10.0, 5.0),
                "krum": run(0.60, 10.0, 5.0)},
            1: {"fedavg": run(0.50, 10.0, 5.0), "tiff": run(0.70, 12.0, 0.5), "median": run(0.60, 10.0, 5.0),
                "krum": run(0.75, 10.0, 5.0)}}
    cell = bench.judge(runs, with_attackers=True, robust=("median", "krum"))
    acc = cell["targets"]["accuracy"]
    # means: median 0.6525, krum 0.675: the bar is krum's; per seed the best of that seed's peers
    assert cell["best_peer"] == "krum" and abs(acc["measured"] - 2.5) < 1e-9 and acc["met"] is True
    assert acc["seeds_met"] == [0]  # seed 0: median 0.705 (-0.5 points); seed 1: krum 0.75 is 5 points over tiff
    assert "max(default, robust)" in acc["target"]
    clean = bench.judge(runs, with_attackers=False, robust=("median", "krum"))["targets"]["accuracy"]
    assert abs(clean["measured"] - 20.0) < 1e-9  # without attackers only the default is the bar


def test_the_classification_dataset_is_generated_and_resolvable_as_a_loader():
    bench = load_bench()
    from mlsyskit.tools.fl.plugins import load_dataset

    x, y, client_of = load_dataset(bench.CLASSIFICATION, 20, 0)
    assert x.shape == (3000, 40) and sorted(set(y.tolist())) == list(range(10)) and client_of is None


def test_quick_mode_runs_end_to_end_and_writes_valid_json(tmp_path):
    bench = load_bench()
    out = tmp_path / "quick.json"
    code = bench.main(["--quick", "--out", str(out)])
    result = json.loads(out.read_text())
    assert set(result["cells"]) == {"digits/alpha=0.5/attackers=0/none", "digits/alpha=0.5/attackers=0.4/label-flip",
                                    "digits/alpha=0.5/attackers=0.4/scaled"}
    for key, cell in result["cells"].items():
        assert cell["part"] == "tuning" and cell["seeds"] == [0] and len(cell["loadavg"]) == 3
        # the robust aggregators set the accuracy bar with attackers; without, the default alone does
        assert set(cell["runs"]["0"]) == ({"fedavg", "tiff"} if key.endswith("/none") else {"fedavg", "tiff", "median"})
        assert all(t["met"] in (True, False, None) for t in cell["targets"].values())
        assert cell["targets"]["ledger_conserved"]["met"] is True
    assert code == (0 if all(t["met"] is not False for c in result["cells"].values()
                             for t in c["targets"].values()) else 1)
    assert result["not_run"] == []
    # --resume keeps the measured cells instead of running them again
    before = out.read_text()
    assert bench.main(["--quick", "--resume", "--out", str(out)]) == code
    assert json.loads(before)["cells"] == json.loads(out.read_text())["cells"]


@pytest.mark.slow  # forks worker processes
def test_cells_past_the_budget_are_listed_not_run_also_from_worker_processes(tmp_path):
    bench = load_bench()
    out = tmp_path / "spent.json"
    assert bench.main(["--quick", "--budget-s", "1e-9", "--workers", "2", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["cells"] == {} and "workers" not in result["setting"]  # the same sweep whatever the workers
    assert sorted(result["not_run"]) == ["digits/alpha=0.5/attackers=0.4/label-flip",
                                         "digits/alpha=0.5/attackers=0.4/scaled",
                                         "digits/alpha=0.5/attackers=0/none"]


def test_summary_counts_each_target_per_dataset_with_its_part_and_range():
    bench = load_bench()
    cells = {}
    for i, (dataset, honest) in enumerate((("digits", 12.0), ("digits", 10.0), ("mnist1d", 11.0))):
        runs = {0: {"fedavg": run(0.8, 10.0, 5.0), "tiff": run(0.8, honest, 1.0)}}
        cells[str(i)] = bench.judge(runs, with_attackers=True) | {
            "dataset": dataset, "part": "tuning" if dataset in bench.TUNING_DATASETS else "held-out"}
    out = bench.summary(cells)
    assert out["digits"]["part"] == "tuning" and out["mnist1d"]["part"] == "held-out"
    honest = out["digits"]["targets"]["honest_tokens"]
    assert (honest["met"], honest["missed"], honest["n/a"]) == (1, 1, 0)
    assert honest["min"] == 1.0 and honest["max"] == 1.2 and abs(honest["mean"] - 1.1) < 1e-12
    assert out["mnist1d"]["targets"]["malicious_tokens"]["met"] == 1
